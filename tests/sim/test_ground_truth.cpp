// The symmetric shortcut against the ground truth: on 2 nodes of 4 GPUs, replaying one GPU with its
// share of every shared resource gives the iteration time of replaying all eight GPUs with their
// own schedules, real collective flows between real GPUs, and each node's PCIe root, DRAM, NVMe,
// CPU and NICs shared by the GPUs that use them: within 1 %, for every placement at mp 1, 2 and 4.
// The broadcast variant (zero_offload) is always replayed in full; for it the test checks that
// each rank's steps ran. The same for pipeline stages, one GPU per stage (StageGroundTruth). Each
// simulation runs in a child process (simulate_isolated).
#include <gtest/gtest.h>

#include <ostream>

#include "sim/replay.hpp"

namespace memwall::sim {
namespace {

// A quarter of a DGX-2 per node (4 GPUs and a quarter of its node-wide bandwidths), two nodes.
HardwareProfile two_small_nodes() {
  HardwareProfile p = *load_profile("dgx2");
  p.nodes = 2;
  p.gpus_per_node = 4;
  p.pcie_aggregate_Bps = 12e9;
  p.cpu_memory_Bps = 25e9;
  p.cpu_adam_params_per_s = 25e9 / kAdamBytesPerParam;
  p.nvme_read_Bps = p.nvme_write_Bps = 6.25e9;
  p.inter_node_Bps = 25e9;
  p.cpu_memory_bytes /= 4;
  p.nvme_capacity_bytes /= 4;
  p.pinned_budget_bytes /= 4;
  return p;
}

ModelSpec ground_truth_model() { return *model_from_shape(4, 2048, 16, 512, 1024); }

// The ground truth: all eight GPUs replayed, each with its own schedule; an error when the schedule
// does not fit or fewer GPUs were replayed.
Result<SimReport> every_gpu(const ModelSpec& m, const Placement& pl, const TrainingConfig& c, const HardwareProfile& p) {
  SimOptions full;
  full.full = true;
  Result<SimReport> all = simulate_isolated(m, pl, c, p, full);
  if (all && all->overflow) return make_error(all->overflow->message);
  if (all && all->ranks_simulated != 8)
    return make_error("the full replay replayed " + std::to_string(all->ranks_simulated) + " GPUs, not 8");
  return all;
}

struct Case {
  std::string placement;
  int mp;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::string& name : preset_names())
    for (int mp : {1, 2, 4}) out.push_back({name, mp});
  return out;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.placement << " mp " << c.mp; }

class GroundTruth : public ::testing::TestWithParam<Case> {};

TEST_P(GroundTruth, SymmetricShortcutMatchesEveryGpuReplayed) {
  const Case& k = GetParam();
  const HardwareProfile p = two_small_nodes();
  const ModelSpec m = ground_truth_model();
  const Placement pl = *preset(k.placement);
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 2;
  c.mp = k.mp;
  c.dp = 8 / k.mp;
  if (pl.layer_major) c.micro_batches = 2;
  Result<SimReport> all = every_gpu(m, pl, c, p);
  ASSERT_TRUE(all.ok()) << all.error();
  EXPECT_EQ(all->nodes_simulated, 2);
  if (pl.fetch == ParamFetch::broadcast) {  // never symmetric: the full replay is the only one
    EXPECT_GT(all->iteration_s, 0);
    return;
  }
  Result<SimReport> one = simulate_isolated(m, pl, c, p, SimOptions{});
  ASSERT_TRUE(one.ok()) << one.error();
  EXPECT_EQ(one->ranks_simulated, 1);
  EXPECT_NEAR(one->iteration_s / all->iteration_s, 1.0, 0.01)
      << k.placement << " mp " << k.mp << ": one GPU " << one->iteration_s << " s, every GPU " << all->iteration_s << " s";
}

INSTANTIATE_TEST_SUITE_P(TwoNodesOfFour, GroundTruth, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.placement + "_mp" + std::to_string(i.param.mp);
                         });

// Pipeline stages: one GPU per stage with its share against every GPU replayed. dp x mp x pp = 8 on
// the two nodes of four: stages of a whole node each (p2p over the NICs), or two stages to a node
// (p2p over NVLink inside a node, over the NICs between them), with the optimizer states and
// checkpoints on the GPU or in CPU memory (the node's PCIe root, DRAM and CPU shared by its stages).
struct StageCase {
  std::string name;
  int mp, dp, pp;
  Tier optim, ckpt;
  bool ckpt_partitioned = false;  // across the mp ranks, all-gathered over NVLink for the recompute
  int virtual_stages = 1;         // interleaved: two stages send both ways (activations 0 -> 1 and gradients)
};

void PrintTo(const StageCase& c, std::ostream* os) { *os << c.name; }

class StageGroundTruth : public ::testing::TestWithParam<StageCase> {};

TEST_P(StageGroundTruth, OneGpuPerStageMatchesEveryGpuReplayed) {
  const StageCase& k = GetParam();
  const HardwareProfile p = two_small_nodes();
  const ModelSpec m = ground_truth_model();
  Placement pl = *preset("data_parallel");
  pl.optim32 = {k.optim, k.optim != Tier::gpu};
  pl.act_ckpt = {k.ckpt, k.ckpt_partitioned};
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 2;
  c.mp = k.mp;
  c.dp = k.dp;
  c.pp = k.pp;
  c.virtual_stages = k.virtual_stages;
  c.grad_accum = 4;
  Result<SimReport> all = every_gpu(m, pl, c, p);
  ASSERT_TRUE(all.ok()) << all.error();
  Result<SimReport> staged = simulate_isolated(m, pl, c, p, SimOptions{});
  ASSERT_TRUE(staged.ok()) << staged.error();
  EXPECT_EQ(staged->ranks_simulated, k.pp);
  EXPECT_FALSE(staged->full);
  EXPECT_NEAR(staged->iteration_s / all->iteration_s, 1.0, 0.01)
      << k.name << ": one GPU per stage " << staged->iteration_s << " s, every GPU " << all->iteration_s << " s";
}

INSTANTIATE_TEST_SUITE_P(
    TwoNodesOfFour, StageGroundTruth,
    ::testing::Values(StageCase{"pp2_mp2_dp2", 2, 2, 2, Tier::gpu, Tier::gpu},
                      StageCase{"pp2_mp1_dp4_optim_cpu", 1, 4, 2, Tier::cpu, Tier::gpu},
                      StageCase{"pp4_mp1_dp2", 1, 2, 4, Tier::gpu, Tier::gpu},
                      StageCase{"pp4_mp2_dp1_ckpt_cpu", 2, 1, 4, Tier::gpu, Tier::cpu},
                      StageCase{"pp2_mp2_dp2_ckpt_cpu_partitioned", 2, 2, 2, Tier::gpu, Tier::cpu, true},
                      StageCase{"pp4_mp1_dp2_optim_cpu_ckpt_cpu", 1, 2, 4, Tier::cpu, Tier::cpu},
                      StageCase{"pp2_mp2_dp2_interleaved2", 2, 2, 2, Tier::gpu, Tier::gpu, false, 2},
                      StageCase{"pp2_mp1_dp4_optim_cpu_ckpt_cpu_interleaved2", 1, 4, 2, Tier::cpu, Tier::cpu, false, 2}),
    [](const ::testing::TestParamInfo<StageCase>& i) { return i.param.name; });

}  // namespace
}  // namespace memwall::sim
