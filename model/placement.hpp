// Placement: for each state (param16, grad16, optim32, act_ckpt) a tier and whether it is
// partitioned across data-parallel ranks (activation checkpoints: across the tensor-slicing ranks,
// whose inputs are the same, as DeepSpeed's partition_activations); the presets of the paper's Table 2 plus three_d and
// l2l; custom placements from YAML or flags, rejected with a reason when not meaningful.
// Value types and pure functions: thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/result.hpp"

namespace memwall {

enum class Tier { gpu, cpu, nvme };
const char* to_string(Tier t);
Result<Tier> parse_tier(std::string_view text);  // "gpu", "cpu", "nvme"

enum class State { param16, grad16, optim32, act_ckpt };
inline constexpr State kAllStates[] = {State::param16, State::grad16, State::optim32, State::act_ckpt};
const char* to_string(State s);

struct StatePlacement {
  Tier tier = Tier::gpu;
  bool partitioned = false;
};

// How full parameters reach a GPU when they are not resident there.
enum class ParamFetch {
  allgather,  // bandwidth-centric: every rank reads 1/dp and all-gathers (ZeRO-Infinity, Sec. 6.1)
  broadcast,  // the owner reads the whole parameter over its own link and broadcasts (ZeRO-Offload)
};

struct Placement {
  std::string name;  // preset name or "custom"
  StatePlacement param16, grad16, optim32, act_ckpt;
  ParamFetch fetch = ParamFetch::allgather;
  bool layer_major = false;  // l2l: relay one layer at a time, looping over micro-batches inside

  const StatePlacement& of(State s) const;
  StatePlacement& of(State s);
};

// Table 2 presets and the two baselines, in the order the paper lists them.
std::vector<std::string> preset_names();
Result<Placement> preset(std::string_view name);

// Checks the placement makes sense; the error says why ("gradients on NVMe need ...").
Result<Placement> validate(const Placement& p);

// A placement YAML: `preset: zero3` (optional base) then per state `{tier: cpu, partitioned: true}`.
Result<Placement> parse_placement(std::string_view yaml_text, const std::string& source);

// "zero3", a .yaml file, and per-state overrides such as "optim32=nvme" (tier only).
Result<Placement> load_placement(const std::string& name_or_path, const std::vector<std::string>& overrides = {});

}  // namespace memwall
