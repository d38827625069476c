// The planner's compute time is the simulator's: both cost each operator with op_step_seconds
// (model/op_cost.hpp). The reference is a real replay of the schedule with every step after the
// one before (no overlap): the compute steps' durations in its trace, summed, against
// estimate_time's compute_s, on profiles that cost operators three ways (the HBM roofline and the
// peak by hidden size, a datasheet profile's GEMM tile and wave model, measured kernel rates) and
// with tensor slicing, tiling, a micro-batch of a fractional sample count, and pipeline stages of
// unequal blocks (the slowest stage's steps against the planner's). Each replay runs in
// a child process (simulate_isolated: SimGrid keeps one engine per process).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>
#include <utility>
#include <string>

#include "model/operator_graph.hpp"
#include "planner/fit.hpp"
#include "planner/search.hpp"
#include "sim/replay.hpp"

namespace memwall::planner {
namespace {

struct Case {
  std::string name, profile;
  int mp = 1, tiling = 1;
  double bsz = 2;
  bool kernels = false;
  int layers = 2, pp = 1, virtual_stages = 1, grad_accum = 1;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The reference: a replay of the candidate's schedule with every step after the one before (no
// overlap); of the steps whose trace name starts with `kind`, the summed durations of the slowest
// replayed GPU (one per pipeline stage), and how many there were.
struct Replayed {
  double slowest_s = 0;
  int steps = 0;
};
Result<Replayed> replayed_steps(const ModelSpec& m, const Candidate& c, const HardwareProfile& p, const std::string& kind) {
  sim::SimOptions o;
  o.overlap = false;
  o.trace = true;
  const Result<sim::SimReport> r = sim::simulate_isolated(m, c.placement, c.config, p, o);
  if (!r) return make_error(r.error());
  std::map<std::pair<int, std::string>, double> busy;
  Replayed out;
  for (const TraceEvent& e : r->trace)
    if (e.name.rfind(kind, 0) == 0) {
      busy[{e.rank, e.track}] += e.end_s - e.start_s;
      ++out.steps;
    }
  for (const auto& [gpu, s] : busy) out.slowest_s = std::max(out.slowest_s, s);
  return out;
}

class ComputeAgreement : public ::testing::TestWithParam<Case> {};

TEST_P(ComputeAgreement, PlannerComputeIsTheReplaysComputeSteps) {
  const Case& k = GetParam();
  HardwareProfile p = *load_profile(k.profile);
  if (k.kernels) p.kernels = {{"gelu", 0, 40e9}, {"attention_scores", 5e12, 0}};
  const ModelSpec m = *model_from_shape(k.layers, 2048, 16, 1024, 50257);
  Candidate c{*preset(k.pp > 1 ? "three_d" : "data_parallel"), {}};
  c.config.pp = k.pp;
  c.config.virtual_stages = k.virtual_stages;
  c.config.grad_accum = k.grad_accum;
  c.config.seq = 1024;
  c.config.bsz = k.bsz;
  c.config.mp = k.mp;
  c.config.dp = 1;
  c.config.tiling_factor = k.tiling;
  const TimeBreakdown t = estimate_time(m, c, p);
  const Result<Replayed> r = replayed_steps(m, c, p, "compute ");
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_GT(r->steps, 0);
  EXPECT_NEAR(t.compute_s, r->slowest_s, 1e-6 * r->slowest_s) << r->steps << " compute steps replayed";
  // and more than Eq. 7's linear layers at the peak: the attention products and the operators
  // bound by HBM bytes cost time too
  EXPECT_GT(t.compute_s, k.grad_accum * computation_flops_eq7(k.bsz, 1024, analysis_param_count(m, true)) / k.mp /
                             k.pp / p.peak_flops_per_s(m.hidden));
}

INSTANTIATE_TEST_SUITE_P(
    Profiles, ComputeAgreement,
    ::testing::Values(Case{"dgx2_roofline", "dgx2"}, Case{"dgx2_sliced_tiled", "dgx2", 2, 2},
                      Case{"dgx2_kernel_rates", "dgx2", 1, 1, 2, true},
                      Case{"a100_gemm_waves", "dgx-a100", 1, 1, 3}, Case{"a100_sliced_tiled", "dgx-a100", 4, 4, 2},
                      Case{"a100_fractional_micro_batch", "dgx-a100", 2, 1, 1.25},
                      // 5 blocks over 2 stages: 2 and 3, the LM head on the second
                      Case{"dgx2_stages_2_and_3", "dgx2", 1, 1, 2, false, 5, 2, 1, 2},
                      // 7 blocks over 2 stages of 2 chunks: 1 + 2 and 2 + 2
                      Case{"a100_interleaved_3_and_4", "dgx-a100", 2, 1, 2, false, 7, 2, 2, 4}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// Adam on the GPU: the planner's optimizer time is the replay's optimizer steps (gpu_adam_seconds
// over the rank's parameters: the whole slice, its 1/dp shard, the fullest pipeline stage's). The
// planner had given it no time while the replay ran it at 30 B per parameter through HBM.
TEST(OptimizerAgreement, PlannerAdamOnTheGpuIsTheReplaysOptimizerSteps) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *model_from_shape(5, 2048, 16, 1024, 50257);
  struct Shape {
    const char* preset;
    int dp, mp, pp;
  };
  for (const Shape& sh : {Shape{"data_parallel", 1, 2, 1}, Shape{"zero3", 4, 1, 1}, Shape{"zero2", 2, 2, 1},
                          Shape{"three_d", 1, 1, 2}}) {
    SCOPED_TRACE(std::string(sh.preset) + " dp " + std::to_string(sh.dp) + " mp " + std::to_string(sh.mp) + " pp " +
                 std::to_string(sh.pp));
    Candidate c{*preset(sh.preset), {}};
    c.config.seq = 1024;
    c.config.bsz = 1;
    c.config.dp = sh.dp;
    c.config.mp = sh.mp;
    c.config.pp = sh.pp;
    c.config.grad_accum = sh.pp;
    const TimeBreakdown t = estimate_time(m, c, p);
    const Result<Replayed> r = replayed_steps(m, c, p, "optimizer ");
    ASSERT_TRUE(r.ok()) << r.error();
    ASSERT_GT(r->slowest_s, 0);
    EXPECT_NEAR(t.optimizer_s, r->slowest_s, 1e-6 * r->slowest_s);
  }
}

// Checkpoints in CPU memory: the planner's iteration against a replay of the same plan (overlap on).
// Two things it had wrong, which made it 8 % optimistic on the 3D plan below and turned plan's
// choice to a slower one: a tensor-slicing rank moves the whole checkpoint unless checkpoints are
// partitioned (it counted 1/mp of it), and a checkpoint comes back to the GPU only when its
// segment's recompute is next (load_checkpoints), so the loads are not hidden behind compute.
TEST(OffloadedCheckpoints, PlannerIterationIsTheReplaysWithinThreePercent) {
  const ModelSpec m = *load_model("table1-10B");
  struct Shape {
    const char* name;
    int nodes;
    const char* preset;
    bool partitioned;
    int mp, pp, v, dp, ga;
    double bsz;
    int ci;
  };
  for (const Shape& sh : {Shape{"3D, whole checkpoints", 8, "three_d", false, 4, 2, 2, 16, 8, 32, 5},
                          Shape{"3D, partitioned checkpoints", 8, "three_d", true, 4, 2, 2, 16, 8, 32, 5},
                          Shape{"3D plain 1F1B, whole checkpoints", 8, "three_d", false, 4, 2, 1, 16, 8, 32, 6}}) {
    SCOPED_TRACE(sh.name);
    const HardwareProfile p = *scale_to_nodes(*load_profile("dgx2"), sh.nodes);
    Candidate c{*preset(sh.preset), {}};
    c.placement.act_ckpt = {Tier::cpu, sh.partitioned};
    c.config.seq = 1024;
    c.config.bsz = sh.bsz;
    c.config.ci = sh.ci;
    c.config.mp = sh.mp;
    c.config.pp = sh.pp;
    c.config.virtual_stages = sh.v;
    c.config.dp = sh.dp;
    c.config.grad_accum = sh.ga;
    const TimeBreakdown t = estimate_time(m, c, p);
    const Result<sim::SimReport> r = sim::simulate_isolated(m, c.placement, c.config, p, sim::SimOptions{});
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_GT(t.act_ckpt_load_s, 0);
    EXPECT_NEAR(t.iteration_s / r->iteration_s, 1, 0.03) << "plan " << t.iteration_s << " s, simulate " << r->iteration_s << " s";
    std::printf("%s: plan %.4g s, simulate %.4g s\n", sh.name, t.iteration_s, r->iteration_s);
  }
}

// The backward overlap on an NVMe that backward also uses (zero_inf_nvme: the parameters are read
// from it in every pass): the planner hid the optimizer's 11.3 s behind backward and predicted
// 14.2 s for table1-10B at bsz 8 on one DGX-2, and so chose the overlap, where the replay takes
// 25.9 s overlapped and 23.4 s after backward. The replay is the reference: the overlap gains
// nothing there, the planner counts nothing hidden and keeps the optimizer after backward, and
// its time is the replay's within 3.5 %: 22.8 s against 23.6 s. The planner's windows lack one
// effect the replay has: on the data-parallel group's one stream (SimOptions::one_stream) a
// segment's recompute all-gathers queue behind the previous segment's last reduce-scatters (the
// replay without it: 23.4 s, 2.7 %). Where the drive holds the optimizer states only
// (zero_inf_nvme with the parameters and gradients in CPU memory) the overlap still counts.
TEST(Overlap, NoGainOnAnNvmeBackwardAlsoUses) {
  const ModelSpec m = *load_model("table1-10B");
  const HardwareProfile p = *load_profile("dgx2");
  Candidate c{*preset("zero_inf_nvme"), {}};
  c.config.seq = 1024;
  c.config.bsz = 8;
  c.config.ci = 2;
  c.config.dp = 16;
  auto replay = [&](OptimizerOverlap ov) {
    TrainingConfig k = c.config;
    k.optimizer_overlap = ov;
    const Result<sim::SimReport> r = sim::simulate_isolated(m, c.placement, k, p, sim::SimOptions{});
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r->iteration_s : 0.0;
  };
  const double after = replay(OptimizerOverlap::none), beside = replay(OptimizerOverlap::backward);
  std::printf("replay: optimizer after backward %.4g s, beside it %.4g s\n", after, beside);
  EXPECT_GT(beside, 0.98 * after) << "the case needs an overlap the replay finds no gain in";
  Candidate overlapped = c;
  overlapped.config.optimizer_overlap = OptimizerOverlap::backward;
  const TimeBreakdown none = estimate_time(m, c, p), bwd = estimate_time(m, overlapped, p);
  EXPECT_EQ(bwd.iteration_s, none.iteration_s);
  EXPECT_NEAR(none.iteration_s / after, 1, 0.035) << "plan " << none.iteration_s << " s, simulate " << after << " s";
  // the search keeps the optimizer after backward
  Fixes fx;
  fx.strategy = "zero_inf_nvme";
  fx.bsz = 8;
  const SearchResult r = search(m, p, *make_space(m, p, fx));
  ASSERT_TRUE(r.fits());
  EXPECT_EQ(r.ranked.front().candidate.config.optimizer_overlap, OptimizerOverlap::none);
  // the states alone on the drive: the overlap hides the optimizer behind backward again
  overlapped.placement.param16.tier = overlapped.placement.grad16.tier = Tier::cpu;
  Candidate plain = overlapped;
  plain.config.optimizer_overlap = OptimizerOverlap::none;
  EXPECT_LT(estimate_time(m, overlapped, p).iteration_s, estimate_time(m, plain, p).iteration_s);
}

// ZeRO-3 at a small micro-batch: the all-gather of a block's fc1 has only the residual add and
// LayerNorm before it to hide behind (Sec. 6.2's prefetcher gathers for operator i+1 while i
// computes), and shares its link with fc2's, issued one operator later. The planner hid the whole
// iteration's traffic behind the whole iteration's compute (table1-10B bsz 2 on one DGX-2: 2.90 s
// planned, 3.59 s replayed); it now costs each group's prefetch window. Tiled 32 ways, each tile's
// gather hides behind the tile before it, less each collective's ring latencies; the replay
// agreed only once the memory plan stopped putting a tile's gradient on the bytes the previous
// tile's reduce-scatter had just given back (3.64 s replayed, 2.99 s now).
TEST(PrefetchWindows, ZeroThreeAtASmallMicroBatchAgreesWithTheReplay) {
  const ModelSpec m = *load_model("table1-10B");
  const HardwareProfile p = *load_profile("dgx2");
  std::map<int, double> planned, replayed;
  for (int tiling : {1, 32}) {
    SCOPED_TRACE(tiling);
    Candidate c{*preset("zero3"), {}};
    c.config.seq = 1024;
    c.config.bsz = 2;
    c.config.ci = 2;
    c.config.dp = 16;
    c.config.tiling_factor = tiling;
    const Result<sim::SimReport> r = sim::simulate_isolated(m, c.placement, c.config, p, sim::SimOptions{});
    ASSERT_TRUE(r.ok()) << r.error();
    const TimeBreakdown t = estimate_time(m, c, p);
    planned[tiling] = t.iteration_s;
    replayed[tiling] = r->iteration_s;
    std::printf("tiling %d: plan %.4g s (compute %.4g s), replay %.4g s\n", tiling, t.iteration_s, t.compute_s,
                r->iteration_s);
    EXPECT_NEAR(t.iteration_s / r->iteration_s, 1, 0.06);
  }
  // both rank them alike: tiling hides the gathers at this micro-batch
  EXPECT_LT(replayed[32], 0.9 * replayed[1]);
  EXPECT_LT(planned[32], 0.9 * planned[1]);
  // and at a micro-batch whose computes hide every gather, the windows add nothing
  Candidate big{*preset("zero3"), {}};
  big.config.seq = 1024;
  big.config.bsz = 16;
  big.config.ci = 2;
  big.config.dp = 16;
  const TimeBreakdown t = estimate_time(m, big, p);
  EXPECT_LT(t.exposed_s, 0.02 * t.iteration_s);
}

// Across nodes with tensor slicing, every slice's data-parallel group gathers its slice through
// the same NICs at once: each GPU gets inter_node / mp of them (tier_efficiencies). The planner gave
// each the node's whole InfiniBand (table1-50B on 2 DGX-2 nodes, mp 2, bsz 1: 3.81 s planned, 6.62 s
// replayed for the plan it chose).
TEST(PrefetchWindows, TensorSlicesShareTheNodesNicsAcrossNodes) {
  const ModelSpec m = *load_model("table1-50B");
  const HardwareProfile p = *scale_to_nodes(*load_profile("dgx2"), 2);
  Candidate c{*preset("zero3"), {}};
  c.config.seq = 1024;
  c.config.bsz = 1;
  c.config.ci = 3;
  c.config.dp = 16;
  c.config.mp = 2;
  c.config.tiling_factor = 8;
  const Result<sim::SimReport> r = sim::simulate_isolated(m, c.placement, c.config, p, sim::SimOptions{});
  ASSERT_TRUE(r.ok()) << r.error();
  const TimeBreakdown t = estimate_time(m, c, p);
  std::printf("plan %.4g s, replay %.4g s\n", t.iteration_s, r->iteration_s);
  EXPECT_NEAR(t.iteration_s / r->iteration_s, 1, 0.05);
}

// ZeRO-2 (the states and gradients partitioned, the parameters whole): after the step each rank
// has updated its shard, and the group all-gathers the 16-bit parameters, after the optimizer and
// behind nothing. The planner left that all-gather out (table1-10B at bsz 1: 1.46 s planned, 1.84
// s simulated on one DGX-2; 0.174 s against 0.234 s on one DGX H100); it counts it now. What is
// left is the end of backward's last reduce-scatter, which the planner hides behind compute.
TEST(OptimizerAgreement, ZeroTwoAllGathersTheParametersAfterTheStep) {
  const ModelSpec m = *load_model("table1-10B");
  for (const char* profile : {"dgx2", "dgx-h100"}) {
    SCOPED_TRACE(profile);
    const HardwareProfile p = *load_profile(profile);
    Candidate c{*preset("zero2"), {}};
    c.config.seq = 1024;
    c.config.bsz = 1;
    c.config.ci = 2;
    c.config.dp = p.gpus_per_node;
    const TimeBreakdown t = estimate_time(m, c, p);
    const Result<sim::SimReport> r = sim::simulate_isolated(m, c.placement, c.config, p, sim::SimOptions{});
    ASSERT_TRUE(r.ok()) << r.error();
    std::printf("%s: plan %.4g s, simulate %.4g s\n", profile, t.iteration_s, r->iteration_s);
    EXPECT_NEAR(t.iteration_s / r->iteration_s, 1, 0.10) << "plan " << t.iteration_s << " s, simulate " << r->iteration_s << " s";
  }
}

}  // namespace
}  // namespace memwall::planner
