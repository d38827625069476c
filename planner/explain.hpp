// Why a plan won, and what a plan that fits nowhere needs: sentences a user can check against the
// profile. Each alternative is one change to the chosen candidate, estimated analytically.
// Pure functions over value types.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "planner/search.hpp"

namespace memwall::planner {

// What a detailed check (the schedule's memory plan, or the executor's memory model) has said of a
// candidate already: why it does not fit, or empty (fits, or not checked).
using Refused = std::function<std::string(const Candidate&)>;

// Why the plan won, in sentences a user can check against the profile: per state why it is on its
// tier (what a faster tier would need), then bsz, ci, tiling and mp, then the placement-order rule.
// An alternative `refused` names is said not to fit, with its reason.
std::vector<std::string> explain(const ModelSpec& m, const HardwareProfile& p, const SearchSpace& space,
                                 const Evaluated& best, const SearchOptions& options = {}, const Refused& refused = {});

// Nothing fits: the smallest shortfall and what to add, e.g. "needs 3.10 TB more NVMe per node
// (28.0 TB < 31.1 TB needed per node) or 2 more nodes".
std::string shortfall_advice(const ModelSpec& m, const HardwareProfile& p, const Fixes& fixes,
                             const SearchResult& result, const SearchOptions& options = {});

}  // namespace memwall::planner
