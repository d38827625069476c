// Memory fit and analytic time of single candidates, against sums done by hand from Eq. 1-11.
#include <gtest/gtest.h>

#include <cmath>

#include "model/analysis.hpp"
#include "model/operator_graph.hpp"
#include "model/schedule.hpp"
#include "planner/fit.hpp"
#include "planner_test_util.hpp"

namespace memwall::planner {
namespace {

using testing::check_of;
using testing::make_candidate;
using testing::make_model;
using testing::make_profile;

// 2 layers, hidden 1024, 16 heads, vocab 1000, seq 1024, as the operator graph counts them:
//   embeddings (1000 + 1024) * 1024 = 2,072,576; a block 12 * 1024^2 + 9 * 1024 (weights and
//   biases) + 4 * 1024 (two LayerNorms) = 12,596,224; the final LayerNorm 2,048: 27,267,072
//   parameters, 20 B each of model states (Sec. 3): 545,341,440 bytes.
constexpr double kStates = 545'341'440.0;
constexpr double kC = 1024;
constexpr double kFc1 = 2 * (4 * kC * kC + 4 * kC);   // fc1's fp16 weights and biases
constexpr double kEmbed = 2 * (1000 + 1024) * kC;     // the tied embedding, fp16
constexpr double kCkpt2 = 2 * 2 * 1024 * kC;          // Eq. 3 per checkpoint at bsz 2
constexpr double kAwm2 = 1024 * 2 * (16 * kC + 2 * 16 * 1024);  // Eq. 5 for one block at bsz 2

TEST(Fit, DataParallelOnOneGpuByHand) {
  HardwareProfile p = make_profile({});
  ModelSpec m = make_model(2, 1024, 16, 1000);
  FitReport f = check_fit(m, make_candidate("data_parallel", 1, 1, 1, 1), p);
  // states + AWM of one block (Eq. 5: 1024 * (16*1024 + 2*16*1024) = 50,331,648) + both
  // checkpoints (Eq. 3: 2 * 1024 * 1024 * 2 = 4,194,304), held together in block 1's forward.
  EXPECT_DOUBLE_EQ(check_of(f, Resource::gpu_memory).needed_bytes, kStates + 50'331'648.0 + 4'194'304.0);
  EXPECT_DOUBLE_EQ(check_of(f, Resource::cpu_memory).needed_bytes, 0);
  EXPECT_DOUBLE_EQ(check_of(f, Resource::nvme).needed_bytes, 0);
  EXPECT_TRUE(f.fits());
}

TEST(Fit, ZeroInfinityNvmeOnFourGpusByHand) {
  HardwareProfile p = testing::make_profile_with_gpus(4);
  ModelSpec m = make_model(2, 1024, 16, 1000);
  FitReport f = check_fit(m, make_candidate("zero_inf_nvme", 2, 1, 1, 4), p);
  // GPU, in block 1's fc2 backward: fc2, fc1 and ln2 fetched (depth 3), fc2's gradient, the tied
  // embedding's gradient, both checkpoints and one block's AWM.
  const double fc2 = 2 * (4 * kC * kC + kC), ln = 2 * 2 * kC;
  EXPECT_DOUBLE_EQ(check_of(f, Resource::gpu_memory).needed_bytes,
                   (fc2 + kFc1 + ln) + fc2 + kEmbed + 2 * kCkpt2 + kAwm2);
  EXPECT_EQ(check_of(f, Resource::gpu_memory).moment, "backward of block1.fc2");
  EXPECT_DOUBLE_EQ(check_of(f, Resource::nvme).needed_bytes, kStates);
  // Pinned: per rank three optimizer chunk buffers of about 1/16 of its quarter of the parameters
  // (cut at 4096-parameter granules: the largest is 425,984), 20 B per parameter (optimizer
  // states, gradient and parameter from NVMe); 4 ranks. Nothing else in CPU memory.
  const double pinned = 4 * 3 * 20 * 425'984.0;
  EXPECT_DOUBLE_EQ(check_of(f, Resource::pinned).needed_bytes, pinned);
  EXPECT_DOUBLE_EQ(check_of(f, Resource::cpu_memory).needed_bytes, pinned);
}

TEST(Fit, TilingDividesTheFetchedWeightsAndCheckpointsMoveToCpu) {
  HardwareProfile p = testing::make_profile_with_gpus(4);
  ModelSpec m = make_model(2, 1024, 16, 1000);
  Candidate c = make_candidate("zero_inf_cpu", 2, 1, 4, 4);
  c.placement.act_ckpt.tier = Tier::cpu;
  FitReport f = check_fit(m, c, p);
  // GPU, in block 1's fc1 backward: three quarter tiles of fc1 fetched and one tile's gradient,
  // the tied embedding's gradient, the one checkpoint loaded back, one block's AWM.
  EXPECT_DOUBLE_EQ(check_of(f, Resource::gpu_memory).needed_bytes, 3 * kFc1 / 4 + kFc1 / 4 + kEmbed + kCkpt2 + kAwm2);
  // CPU: all model states + both checkpoints of each of the node's 4 GPUs, which are its buffers.
  EXPECT_DOUBLE_EQ(check_of(f, Resource::cpu_memory).needed_bytes, kStates + 4 * 2 * kCkpt2);
  EXPECT_DOUBLE_EQ(check_of(f, Resource::pinned).needed_bytes, 4 * 2 * kCkpt2);
}

TEST(Fit, BindingLimitSaysWhichAndByHowMuch) {
  testing::ProfileSpec s;
  s.cpu_memory = "100 MB";
  s.pinned = "50 MB";
  HardwareProfile p = make_profile(s);
  ModelSpec m = make_model(2, 1024, 16, 1000);
  FitReport f = check_fit(m, make_candidate("zero_inf_cpu", 1, 1, 1, 1), p);
  EXPECT_FALSE(f.fits());
  EXPECT_EQ(f.binding().resource, Resource::cpu_memory);
  EXPECT_DOUBLE_EQ(f.binding().shortfall_bytes(), kStates - 100e6);
  EXPECT_EQ(f.binding().sentence(), "CPU memory 100 MB < 545 MB needed per node");
}

TEST(Fit, LargestAllocationIsTheFc1WeightTile) {
  HardwareProfile p = make_profile({});
  FitOptions o;
  o.max_alloc_bytes = 2.0 * (1 << 30);
  // 2 x 16K x 64K bytes = exactly 2 GiB: accepted; 17K is not.
  FitReport at16k = check_fit(make_model(1, 16384, 16), make_candidate("zero_inf_cpu", 1, 1, 1, 1), p, o);
  EXPECT_DOUBLE_EQ(check_of(at16k, Resource::gpu_largest_alloc).needed_bytes, 2.0 * (1 << 30));
  EXPECT_TRUE(check_of(at16k, Resource::gpu_largest_alloc).fits());
  FitReport at17k = check_fit(make_model(1, 17408, 16), make_candidate("zero_inf_cpu", 1, 1, 1, 1), p, o);
  EXPECT_FALSE(check_of(at17k, Resource::gpu_largest_alloc).fits());
  // 64K in 16 tiles is 2 GiB again.
  FitReport at64k = check_fit(make_model(1, 65536, 16), make_candidate("zero_inf_cpu", 1, 1, 16, 1), p, o);
  EXPECT_DOUBLE_EQ(check_of(at64k, Resource::gpu_largest_alloc).needed_bytes, 2.0 * (1 << 30));
  // No limit given: no check.
  FitReport none = check_fit(make_model(1, 65536, 16), make_candidate("zero_inf_cpu", 1, 1, 1, 1), p);
  for (const LimitCheck& c : none.checks) EXPECT_NE(c.resource, Resource::gpu_largest_alloc);
}

// gpu.reserve (issue 28 item 4): the GPU check needs the reserve beside the training's bytes, as a
// named part, with a communicator for the data-parallel group only when there is one.
TEST(Fit, FrameworkReserveIsNeededBesideTheTraining) {
  const HardwareProfile bare = testing::make_profile_with_gpus(4);
  HardwareProfile p = bare;
  p.gpu_reserve = GpuReserve{600.0 * (1 << 20), 32.0 * (1 << 20), 128.0 * (1 << 20), true};
  const ModelSpec m = make_model(2, 1024, 16, 1000);
  for (int dp : {1, 4}) {
    const Candidate c = make_candidate("zero3", 2, 1, 1, dp);
    const LimitCheck without = check_of(check_fit(m, c, bare), Resource::gpu_memory);
    const LimitCheck with = check_of(check_fit(m, c, p), Resource::gpu_memory);
    const double reserve = (600.0 + 32 + (dp > 1 ? 128 : 0)) * (1 << 20);
    EXPECT_DOUBLE_EQ(with.needed_bytes, without.needed_bytes + reserve) << "dp " << dp;
    EXPECT_DOUBLE_EQ(with.capacity_bytes, without.capacity_bytes);
    ASSERT_FALSE(with.parts.empty());
    EXPECT_DOUBLE_EQ(with.parts.back().bytes, reserve);
    EXPECT_NE(with.parts.back().what.find("framework reserve (gpu.reserve: context 600 MiB"), std::string::npos)
        << with.parts.back().what;
  }
}

// Every operator of the whole graph (the attention products and the LM head too, not only Eq. 7's
// linear layers) at the peak of a profile without HBM or GEMM rates; the TFLOPS the planner prints
// are Eq. 7-8's, so below the peak by the FLOPs Eq. 7 leaves out.
TEST(Time, EverythingOnOneGpuIsComputeAtPeak) {
  HardwareProfile p = make_profile({});
  ModelSpec m = make_model(2, 1024, 16, 1000);
  TimeBreakdown t = estimate_time(m, make_candidate("data_parallel", 4, 1, 1, 1), p);
  const OperatorGraph g = build_gpt_graph(m, 4, 1024);
  const double graph_flops = g.linear_flops() + g.other_flops();
  EXPECT_NEAR(t.compute_s, graph_flops / 100e12, 1e-12 * t.compute_s);
  EXPECT_DOUBLE_EQ(t.iteration_s, t.compute_s);
  const double eq7 = computation_flops_eq7(4, 1024, analysis_param_count(m, true));
  EXPECT_LT(eq7, graph_flops);
  EXPECT_NEAR(t.tflops_per_gpu, 100.0 * eq7 / graph_flops, 1e-9);
}

// A profile that rates GEMMs by shape (here the tile and wave model of gpu.sms): each linear layer
// of a block at its own shape's rate, the rest of Eq. 7 at the peak; a tiling whose tiles leave SMs
// idle costs more, one that fills them does not.
TEST(Time, LinearLayersRunAtTheirShapesRate) {
  HardwareProfile p = make_profile({});
  ModelSpec m = make_model(2, 1024, 16, 1000);
  const Candidate c = make_candidate("zero3", 4, 1, 1, 1);
  const double flat = estimate_time(m, c, p).compute_s;
  p.gpu_sms = 16;
  const TimeBreakdown t = estimate_time(m, c, p);
  const long tokens = 4 * 1024;
  double linear_flops = 0, linear_s = 0;
  for (OpRole role : {OpRole::qkv, OpRole::proj, OpRole::fc1, OpRole::fc2}) {
    const GemmShape g = linear_gemm_shape(m, role, tokens, 1, 1);
    const double flops = 8.0 * tokens * g.n * g.k * 2;  // two layers
    linear_flops += flops;
    linear_s += flops / p.gemm_rate(g.m, g.n, g.k);
  }
  EXPECT_NEAR(t.compute_s, linear_s + (flat * 100e12 - linear_flops) / 100e12, 1e-12);
  // tiles are never faster than the layer; fc1's forward outputs (4096 x 4096) are 512 tiles of the
  // model's 256 x 128, a quarter of them 128: on 48 SMs 11 waves (512 of 528 slots used) against 3
  // (128 of 144), and the weight gradients' thin tiles leave more idle
  Candidate tiled = c;
  tiled.config.tiling_factor = 4;
  EXPECT_GE(estimate_time(m, tiled, p).compute_s, t.compute_s);
  p.gpu_sms = 48;
  const double untiled_48 = estimate_time(m, c, p).compute_s;
  EXPECT_GT(estimate_time(m, tiled, p).compute_s, untiled_48 * 1.05);
}

// --sync-grad-copies: ZeRO-Offload's owners copy gradients one rank at a time (Fig. 8's baseline):
// the whole gradient over one rank's link is added to the iteration, where the all-gather scheme's
// per-rank parts hide behind compute. The rest of the two estimates is the same here: parameters
// stay on the GPU and CPU Adam updates each rank's partition either way.
TEST(Time, ZeroOffloadOwnersGradientCopiesAreNotHidden) {
  HardwareProfile p = testing::make_profile_with_gpus(4);
  ModelSpec m = make_model(2, 1024, 16, 1000);
  Candidate owners = make_candidate("zero_offload", 16, 1, 1, 4);
  owners.config.sync_grad_copies = true;
  Candidate parts = owners;
  parts.placement.fetch = ParamFetch::allgather;
  const TimeBreakdown a = estimate_time(m, owners, p), b = estimate_time(m, parts, p);
  ASSERT_GT(b.compute_s, b.param_grad_s + b.act_ckpt_s);  // the all-gather scheme's transfers hide
  EXPECT_GT(a.param_grad_s, 0);
  ASSERT_GT(a.compute_s, a.param_grad_s);  // hidden, were it overlapped
  // the owner also returns the updated parameters over its one link: that part of the optimizer differs too
  const double refresh = std::max(a.optimizer_s, a.refresh_s) - std::max(b.optimizer_s, b.refresh_s);
  EXPECT_NEAR(a.iteration_s - b.iteration_s, a.param_grad_s + refresh, 1e-9 * a.iteration_s);
  // memwall's own executor copies beside the backward (the default): hidden like the parts
  owners.config.sync_grad_copies = false;
  EXPECT_NEAR(estimate_time(m, owners, p).iteration_s - b.iteration_s, refresh, 1e-9 * a.iteration_s);
}

TEST(Time, CpuOptimizerIsTheSlowerOfTrafficAndCpuAdam) {
  HardwareProfile p = make_profile({});
  ModelSpec m = make_model(2, 1024, 16, 1000);
  TimeBreakdown t = estimate_time(m, make_candidate("zero_inf_cpu", 1, 1, 1, 1), p);
  const double params = params_eq1(2, 1024);
  // Eq. 10 traffic: 32 B/param over 100 GB/s = 8.05 ms; CPU Adam 1.5 G params/s = 16.8 ms.
  EXPECT_DOUBLE_EQ(t.optimizer_s, params / 1.5e9);
  EXPECT_GT(t.optimizer_s, 32 * params / 100e9);
  // Parameters and gradients (Eq. 9: 8 B/param) over one GPU's 12 GB/s, hidden behind compute when shorter.
  EXPECT_NEAR(t.param_grad_s, 8 * params / 12e9, 1e-12);
  EXPECT_NEAR(t.exposed_s, std::max(0.0, t.param_grad_s - t.compute_s) + t.optimizer_s, 1e-12);
}

// On NVMe the optimizer's states cross without their fp32 gradient, as the schedule swaps them
// (MemorySizes::swapped_optim_bytes): 12 of Eq. 10's 16 B each way.
TEST(Time, NvmeOptimizerSwapsTheStatesWithoutTheirGradient) {
  HardwareProfile p = make_profile({});
  p.cpu_adam_params_per_s = 1e18;  // the traffic binds
  ModelSpec m = make_model(2, 1024, 16, 1000);
  Candidate c = make_candidate("zero_inf_nvme", 1, 1, 1, 1);
  // Eq. 10's time at the optimizer's bandwidth to `tier`
  auto eq10_s = [&](const std::string& tier) {
    double bw = 0;
    for (const StateTierEfficiency& e : tier_efficiencies(p, m, c.config, c.config.dp))
      if (e.state == AitState::optimizer && e.tier == tier && bw == 0) bw = e.bw_Bps;
    EXPECT_GT(bw, 0) << tier;
    return computation_flops_eq7(c.config.bsz, c.config.seq, analysis_param_count(m)) /
           ait_optimizer_eq10(c.config.bsz, c.config.seq) / bw;
  };
  // on NVMe the schedule's optimizer phase: 12 B of states read and written, the 16-bit gradient
  // read and the 16-bit parameters written back (zero_inf_nvme keeps both there): 28 of Eq. 10's 32
  const double nvme = eq10_s("nvme");
  EXPECT_NEAR(estimate_time(m, c, p).optimizer_s, 28.0 / 32 * nvme, 1e-9 * nvme);
  const Schedule sched = *build_schedule(m, c.placement, c.config, p);
  double swapped = 0;
  for (const Step& st : sched.steps)
    if (st.phase == Phase::optimizer && (st.src == Tier::nvme || st.dst == Tier::nvme)) swapped += st.bytes;
  EXPECT_NEAR(swapped / model_param_count(m), 28.0, 0.01);  // bytes per parameter, embeddings included
  // gradients and parameters elsewhere: the states alone
  c.placement = *preset("zero_inf_cpu");
  c.placement.optim32.tier = Tier::nvme;
  EXPECT_NEAR(estimate_time(m, c, p).optimizer_s, 24.0 / 32 * nvme, 1e-9 * nvme);
  // in CPU memory Adam reads and writes all of it: Eq. 10 whole
  c.placement = *preset("zero_inf_cpu");
  const double cpu = eq10_s("cpu");
  EXPECT_NEAR(estimate_time(m, c, p).optimizer_s, cpu, 1e-9 * cpu);
}

TEST(Time, PrefetchDepthZeroExposesEveryTransfer) {
  HardwareProfile p = make_profile({});
  ModelSpec m = make_model(2, 1024, 16, 1000);
  Candidate c = make_candidate("zero_inf_cpu", 8, 1, 1, 1);
  TimeBreakdown overlapped = estimate_time(m, c, p);
  c.config.prefetch_depth = 0;
  TimeBreakdown serial = estimate_time(m, c, p);
  // on demand every transfer is exposed; prefetched, no more than all of them and no less than what
  // the whole iteration's compute cannot hide (the prefetch windows may leave more)
  const double besides = serial.exposed_s - serial.param_grad_s;  // the optimizer's and the rest
  EXPECT_GT(besides, -1e-12);
  const double exposed_fb = overlapped.exposed_s - besides;
  EXPECT_GE(exposed_fb, std::max(0.0, overlapped.param_grad_s - overlapped.compute_s) - 1e-12);
  EXPECT_LE(exposed_fb, overlapped.param_grad_s + 1e-12);
  EXPECT_GT(serial.iteration_s, overlapped.iteration_s);
  // --sync-fetches (DeepSpeed v0.3.x's synchronize before each all-gather) at the default depth:
  // the same, nothing hides behind the computes
  c.config.prefetch_depth = 3;
  c.config.sync_fetches = true;
  EXPECT_NEAR(estimate_time(m, c, p).iteration_s, serial.iteration_s, 1e-12);
}

// The search's estimate_times: one call for every overlap the placement allows equals estimate_time
// with each; with a bound, it gives up (false, nothing written) only when every overlap's time per
// sample is beyond it, so what it returns is never a pruned candidate's time: checked against the
// times themselves on either side of the bound, across placements with and without windows.
TEST(Time, EveryOverlapAtOnceIsEachOverlapAloneAndTheBoundOnlySkips) {
  HardwareProfile p = *load_profile("dgx2");
  ModelSpec m = *load_model("table1-10B");
  const TimeFacts facts = TimeFacts::of(m, p);
  const std::vector<OptimizerOverlap> overlaps = {OptimizerOverlap::none, OptimizerOverlap::backward,
                                                  OptimizerOverlap::dpu};
  int gave_up = 0, kept = 0;
  for (const char* placement : {"zero_offload", "zero_inf_cpu", "zero_inf_nvme", "zero3"})
    for (double bsz : {1.0, 4.0, 16.0}) {
      Candidate c = make_candidate(placement, bsz, 1, 1, 16);
      c.config.seq = m.seq;
      c.config.dp = 16;
      const TierBandwidths bw = TierBandwidths::of(tier_efficiencies(p, m, c.config, c.config.dp));
      std::vector<TimeBreakdown> all(overlaps.size());
      ASSERT_TRUE(estimate_times(m, c.placement, c.config, p, facts, bw, overlaps, all));
      double fastest = INFINITY;
      for (size_t i = 0; i < overlaps.size(); ++i) {
        Candidate one = c;
        one.config.optimizer_overlap = overlaps[i];
        const TimeBreakdown alone = estimate_time(m, one, p);
        EXPECT_DOUBLE_EQ(all[i].iteration_s, alone.iteration_s) << placement << " bsz " << bsz << " " << i;
        EXPECT_DOUBLE_EQ(all[i].exposed_s, alone.exposed_s) << placement << " bsz " << bsz << " " << i;
        fastest = std::min(fastest, alone.iteration_s / global_batch(c.config));
      }
      for (double bound : {fastest * 0.5, fastest * 0.999, fastest * 1.001, fastest * 2}) {
        std::vector<TimeBreakdown> some(overlaps.size());
        if (estimate_times(m, c.placement, c.config, p, facts, bw, overlaps, some, bound)) {
          ++kept;
          for (size_t i = 0; i < overlaps.size(); ++i) EXPECT_DOUBLE_EQ(some[i].iteration_s, all[i].iteration_s);
        } else {
          ++gave_up;
          EXPECT_GT(fastest, bound) << placement << " bsz " << bsz << ": gave up below the bound";
          for (const TimeBreakdown& t : some) EXPECT_EQ(t.iteration_s, 0) << "written although it gave up";
        }
      }
    }
  EXPECT_GT(gave_up, 0);
  EXPECT_GT(kept, 0);
}

// The search makes tier_efficiencies' bandwidths once per (dp, mp): they must not move with the
// micro-batch, the checkpoint interval or pipeline stages (their efficiencies do; estimate_time
// does not read those).
TEST(Time, TierBandwidthsDependOnDpAndMpOnly) {
  for (const char* profile : {"dgx2", "dgx-a100", "dgx-h100", "local-cpu"}) {
    HardwareProfile p = *load_profile(profile);
    if (Result<HardwareProfile> many = scale_to_nodes(p, 4)) p = *many;  // across nodes where the profile scales
    ModelSpec m = *load_model("table1-10B");
    for (int mp : {1, 2})
      for (int dp : {1, 2, p.total_gpus() / mp}) {
        TrainingConfig base;
        base.seq = m.seq;
        base.mp = mp;
        base.dp = dp;
        const TierBandwidths ref = TierBandwidths::of(tier_efficiencies(p, m, base, dp));
        for (double bsz : {1.0, 7.0, 32.0})
          for (int ci : {1, 5})
            for (int pp : {1, 2}) {
              TrainingConfig k = base;
              k.bsz = bsz;
              k.ci = ci;
              k.pp = pp;
              EXPECT_EQ(TierBandwidths::of(tier_efficiencies(p, m, k, dp)).bps, ref.bps)
                  << profile << " mp " << mp << " dp " << dp << " bsz " << bsz << " ci " << ci << " pp " << pp;
            }
      }
  }
}

// FitOptions::words = false: the search's fits carry the same numbers as the worded ones, without
// their parts and moments.
TEST(Fit, NumbersOnlyAreTheWordedFitsNumbers) {
  HardwareProfile p = *load_profile("dgx2");
  ModelSpec m = *load_model("table1-10B");
  for (const char* placement : {"data_parallel", "zero_offload", "zero_inf_nvme"}) {
    Candidate c = make_candidate(placement, 8, 2, 1, 16);
    c.config.seq = m.seq;
    c.config.dp = 16;
    FitOptions quiet;
    quiet.words = false;
    const FitReport a = check_fit(m, c, p), b = check_fit(m, c, p, quiet);
    ASSERT_EQ(a.checks.size(), b.checks.size());
    for (size_t i = 0; i < a.checks.size(); ++i) {
      EXPECT_EQ(a.checks[i].needed_bytes, b.checks[i].needed_bytes) << placement << " " << i;
      EXPECT_EQ(a.checks[i].capacity_bytes, b.checks[i].capacity_bytes) << placement << " " << i;
      EXPECT_TRUE(b.checks[i].parts.empty());
      EXPECT_TRUE(b.checks[i].moment.empty());
    }
    EXPECT_FALSE(a.checks.front().parts.empty());
    EXPECT_EQ(a.fits(), b.fits());
  }
}

}  // namespace
}  // namespace memwall::planner
