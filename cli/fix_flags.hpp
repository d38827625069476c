// `memwall plan --fix key=value`: the CLI's words for planner::Fixes. Keys: strategy (a preset),
// param16, grad16, optim32, act_ckpt (a tier), fetch (allgather|broadcast), bsz, ci, tiling, mp,
// prefetch_depth, optimizer_overlap.
#pragma once

#include <string>
#include <vector>

#include "model/result.hpp"
#include "planner/search.hpp"

namespace memwall::cli {

// Errors (one line, for exit code 2): unknown key, bad value, the same key twice with different values.
Result<planner::Fixes> parse_fixes(const std::vector<std::string>& key_values);

}  // namespace memwall::cli
