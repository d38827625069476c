// Helpers shared by the planner tests: small hand-made profiles and candidates.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "planner/fit.hpp"
#include "planner/recommend.hpp"
#include "planner/search.hpp"

namespace memwall::planner::testing {

struct ProfileSpec {
  int gpus_per_node = 1;
  std::string gpu_memory = "80 GB";
  std::string cpu_memory = "1 TB";
  std::string pinned = "100 GB";
  std::string nvme = "10 TB";
  std::string inter_node = "";  // empty: a profile that cannot be scaled
};

inline HardwareProfile make_profile(const ProfileSpec& s) {
  std::string y = "name: test\nnodes: 1\ngpu:\n  count_per_node: " + std::to_string(s.gpus_per_node) +
                  "\n  memory: " + s.gpu_memory + "\n  peak: 100 TFLOPS\nlinks:\n" +
                  (s.gpus_per_node > 1 ? "  gpu_gpu: 100 GB/s\n" : "") +
                  "  pcie_single_gpu: 12 GB/s\n  pcie_aggregate: " + std::to_string(12 * s.gpus_per_node) + " GB/s\n" +
                  (s.inter_node.empty() ? "" : "  inter_node: " + s.inter_node + "\n") +
                  "cpu:\n  memory: " + s.cpu_memory + "\n  memory_bandwidth: 100 GB/s\n  adam_throughput: 1.5 G params/s\n"
                  "  pinned_budget: " + s.pinned + "\nnvme:\n  capacity: " + s.nvme + "\n  read: 25 GB/s\n  write: 25 GB/s\n";
  Result<HardwareProfile> p = parse_profile(y, "test.yaml");
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error());
  return *p;
}

// The hand-made profile with `gpus` GPUs in its one node, the rest as ProfileSpec's defaults.
inline HardwareProfile make_profile_with_gpus(int gpus) {
  ProfileSpec s;
  s.gpus_per_node = gpus;
  return make_profile(s);
}

inline ModelSpec make_model(int layers, long hidden, int heads, long vocab = 1024) {
  Result<ModelSpec> m = model_from_shape(layers, hidden, heads, 1024, vocab);
  EXPECT_TRUE(m.ok());
  return *m;
}

inline Candidate make_candidate(const std::string& preset_name, double bsz, int ci, int tiling, int dp, int mp = 1) {
  Candidate c;
  c.placement = *preset(preset_name);
  c.config.bsz = bsz;
  c.config.seq = 1024;
  c.config.ci = ci;
  c.config.tiling_factor = tiling;
  c.config.dp = dp;
  c.config.mp = mp;
  return c;
}

inline const LimitCheck& check_of(const FitReport& f, Resource r) {
  for (const LimitCheck& c : f.checks)
    if (c.resource == r) return c;
  ADD_FAILURE() << "no check for " << to_string(r);
  return f.checks.front();
}

// Table 1's 10B model in 3D on 8 DGX-2 nodes, 2 chunks per stage, checkpoints kept on the GPU: its
// analytic best fits the memory model but not the detailed schedule's arena, so recommend sets it
// aside and plans the next.
struct RefusedCase {
  ModelSpec m;
  HardwareProfile p;
  Recommendation rec;
};
inline RefusedCase recommend_with_a_refusal() {
  RefusedCase c{*load_model("table1-10B"), *scale_to_nodes(*load_profile("dgx2"), 8), {}};
  Fixes fx;
  fx.strategy = "three_d";
  fx.virtual_stages = 2;
  fx.tiers[State::act_ckpt] = Tier::gpu;
  c.rec = recommend(c.m, c.p, *make_space(c.m, c.p, fx), fx, SearchOptions{});
  return c;
}

}  // namespace memwall::planner::testing
