// Replay against the closed form: with overlap off and one state moving over one link class (the
// others given unlimited bandwidth, as in the paper's Sec. 4.2 footnote), the simulated efficiency
// is Eq. 6 within 2 %. Also: overlap helps, and a schedule that does not fit is not simulated.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <optional>

#include "model/analysis.hpp"
#include "sim/collectives.hpp"
#include "sim/platform.hpp"
#include "sim/replay.hpp"

namespace memwall::sim {
namespace {

constexpr double kHuge = 1e15;  // "unlimited" bandwidth or throughput

ModelSpec model() { return *model_from_shape(4, 4096, 32, 1024, 1000); }

// Trace intervals [start, end] in seconds.
using Intervals = std::vector<std::pair<double, double>>;

// Over every pair of one interval of `a` and one of `b`, the time both cover, summed.
double intersection_s(const Intervals& a, const Intervals& b) {
  double both = 0;
  for (auto [x0, x1] : a)
    for (auto [y0, y1] : b) both += std::max(0.0, std::min(x1, y1) - std::max(x0, y0));
  return both;
}

// A traced replay of zero_inf_cpu on a DGX-2's 16 GPUs at bsz 2, the configuration changed by `set`,
// and the schedule it replayed (the fetch tests below).
struct Traced {
  SimReport report;
  Schedule schedule;
};
std::optional<Traced> traced_zero_inf_cpu(const ModelSpec& m, const std::function<void(TrainingConfig&)>& set) {
  const HardwareProfile p = *load_profile("dgx2");
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 2;
  c.dp = 16;
  set(c);
  const Placement pl = *preset("zero_inf_cpu");
  SimOptions o;
  o.trace = true;
  Result<SimReport> r = simulate_isolated(m, pl, c, p, o);
  Result<Schedule> s = build_schedule(m, pl, c, p);
  if (!r || !s) {
    ADD_FAILURE() << (r ? s.error() : r.error());
    return std::nullopt;
  }
  return Traced{*r, *s};
}

// Over every pair of two intervals of `v`, the time both cover, summed.
double overlap_within_s(const Intervals& v) {
  double length = 0;
  for (auto [a, b] : v) length += b - a;
  return (intersection_s(v, v) - length) / 2;  // each pair counted twice, each interval with itself once
}

HardwareProfile unlimited_but(const std::string& keep) {
  HardwareProfile p = *load_profile("dgx2");
  p.cpu_adam_params_per_s = kHuge;
  p.cpu_memory_Bps = kHuge;
  p.gpu_memory_Bps = kHuge;  // operators and Adam cost their FLOPs only
  if (keep != "pcie") p.pcie_single_gpu_Bps = p.pcie_aggregate_Bps = kHuge;
  if (keep != "nvme") p.nvme_read_Bps = p.nvme_write_Bps = kHuge;
  return p;
}

// Simulates with one rank and overlap off; compares with Eq. 6 for the bytes on `link` at `bw`.
void expect_eq6(const Placement& pl, const HardwareProfile& p, LinkClass link, double bw) {
  ModelSpec m = model();
  TrainingConfig c;
  c.dp = 1;
  c.seq = m.seq;
  Result<Schedule> s = build_schedule(m, pl, c, p);
  ASSERT_TRUE(s.ok()) << s.error();
  const double bytes = s->traffic_bytes[int(link)];
  ASSERT_GT(bytes, 0);
  SimOptions o;
  o.overlap = false;
  Result<SimReport> r = simulate(m, pl, c, p, o);
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_FALSE(r->overflow);
  const double peak = p.peak_flops_per_s(m.hidden);
  const double expected = efficiency_eq6(s->compute_flops / bytes, bw, peak);
  EXPECT_NEAR(r->efficiency / expected, 1.0, 0.02) << "simulated " << r->efficiency << ", Eq. 6 " << expected;
  EXPECT_LT(r->efficiency, 0.999);  // the state's traffic did cost time
}

TEST(ReplayEq6, ParametersAndGradientsOverPcie) {
  Placement pl = *preset("zero_inf_cpu");  // param16, grad16, optim32 in CPU memory
  expect_eq6(pl, unlimited_but("pcie"), LinkClass::cpu_gpu, 12e9);
}

TEST(ReplayEq6, OptimizerStatesOnNvme) {
  Placement pl = *preset("zero_offload");  // parameters and gradients stay on the GPU
  pl.grad16 = {Tier::gpu, true};
  pl.optim32 = {Tier::nvme, true};
  ASSERT_TRUE(validate(pl).ok()) << validate(pl).error();
  expect_eq6(pl, unlimited_but("nvme"), LinkClass::nvme_cpu, 25e9);
}

TEST(ReplayEq6, ActivationCheckpointsToCpu) {
  Placement pl = *load_placement("data_parallel", {"act_ckpt=cpu"});
  expect_eq6(pl, unlimited_but("pcie"), LinkClass::cpu_gpu, 12e9);
}

TEST(Replay, OverlapHidesTransfers) {
  ModelSpec m = model();
  HardwareProfile p = *load_profile("dgx2");
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 2;
  Placement pl = *preset("zero_inf_cpu");
  // SimGrid allows one engine per process, so compare with the serial sum of the parts instead of
  // a second simulation: compute, every PCIe byte at 3 GB/s (16 GPUs share 48 GB/s), every NVLink
  // byte at 70 GB/s, and CPU Adam on this rank's 1/16 of the parameters at 1/16 of the CPU.
  Result<SimReport> a = simulate(m, pl, c, p, SimOptions{});
  ASSERT_TRUE(a.ok()) << a.error();
  Result<Schedule> s = build_schedule(m, pl, c, p);
  double optimizer_params = 0;
  for (const Step& st : s->steps) optimizer_params += st.params;
  const double compute = s->compute_flops / p.peak_flops_per_s(m.hidden);
  const double adam = optimizer_params / (p.cpu_adam_params_per_s / 16);
  const double serial = compute + adam + s->traffic_bytes[int(LinkClass::cpu_gpu)] / 3e9 +
                        s->traffic_bytes[int(LinkClass::gpu_gpu)] / 70e9;
  EXPECT_LT(a->iteration_s, 0.95 * serial);
  EXPECT_GT(a->iteration_s, compute + adam);  // the optimizer step cannot overlap (Sec. 4.2)
  EXPECT_GT(a->busy_fraction.at("gpu_compute"), 0.0);
  EXPECT_GT(a->busy_fraction.at("pcie"), 0.0);
}

// Gradient accumulation (issue 17): each extra micro-step adds the same time, and the optimizer
// (CPU Adam on this rank's partition, not overlapped) runs once, so one iteration of k micro-steps
// is the optimizer plus k times a micro-step. The planner's analytic time has the same form.
TEST(Replay, GradientAccumulationRepeatsTheMicroStepNotTheOptimizer) {
  ModelSpec m = model();
  HardwareProfile p = *load_profile("dgx2");
  Placement pl = *preset("zero_inf_cpu");
  double t[4] = {0, 0, 0, 0};
  for (int k = 1; k <= 3; ++k) {
    TrainingConfig c;
    c.seq = m.seq;
    c.bsz = 2;
    c.grad_accum = k;
    Result<SimReport> r = simulate_isolated(m, pl, c, p, SimOptions{});
    ASSERT_TRUE(r.ok()) << r.error();
    ASSERT_FALSE(r->overflow);
    t[k] = r->iteration_s;
  }
  const double step = t[2] - t[1];
  EXPECT_NEAR((t[3] - t[2]) / step, 1.0, 0.03) << t[1] << " " << t[2] << " " << t[3];
  // the part that runs once: this rank's CPU Adam, which cannot overlap (Sec. 4.2)
  TrainingConfig one;
  one.bsz = 2;
  one.seq = m.seq;
  Result<Schedule> s = build_schedule(m, pl, one, p);
  ASSERT_TRUE(s.ok()) << s.error();
  double params = 0;
  for (const Step& st : s->steps) params += st.params;
  const double adam = params / (p.cpu_adam_params_per_s / 16);
  EXPECT_GT(t[1] - step, 0.9 * adam);
  EXPECT_LT(step, t[1]);
}

// Gradient clipping: its grad_norm step reads this rank's gradient partition once, between the last
// gradient and the first update, through HBM (zero3) or CPU memory (zero_inf_cpu); nothing for
// NVMe, where the sums were taken as the gradients were written. One rank: nothing to exchange.
TEST(Replay, GradientClippingAddsOnePassOverTheGradients) {
  ModelSpec m = model();
  HardwareProfile p = *load_profile("dgx2");
  for (const char* name : {"zero3", "zero_inf_cpu", "zero_inf_nvme"}) {
    SCOPED_TRACE(name);
    const Placement pl = *preset(name);
    TrainingConfig c;
    c.seq = m.seq;
    c.dp = 1;
    double t[2] = {0, 0}, pass = 0;
    for (int clip : {0, 1}) {
      c.grad_clip = clip;
      Result<SimReport> r = simulate_isolated(m, pl, c, p, SimOptions{});
      ASSERT_TRUE(r.ok()) << r.error();
      ASSERT_FALSE(r->overflow);
      t[clip] = r->iteration_s;
    }
    Result<Schedule> s = build_schedule(m, pl, c, p);
    ASSERT_TRUE(s.ok()) << s.error();
    for (const Step& st : s->steps)
      if (st.kind == StepKind::grad_norm) pass += st.bytes;
    const double expect = pl.grad16.tier == Tier::gpu ? pass / p.gpu_memory_Bps : pass / p.cpu_memory_Bps;
    if (pl.grad16.tier == Tier::nvme) EXPECT_EQ(pass, 0);
    else EXPECT_GT(pass, 1e9);  // 2 bytes per parameter of the 805 M
    EXPECT_NEAR(t[1] - t[0], expect, 0.05 * expect + 1e-4) << t[0] << " -> " << t[1];
  }
}

// Pipeline stages (issue 17, item 4), one GPU per stage: with everything on the GPU and one
// data-parallel rank, p stages each do 1/p of a micro-step, and 1F1B idles for p - 1 micro-steps'
// time, so m micro-steps take (m + p - 1) / (p m) of one GPU's time for them. The stages' sends and
// receives meet as flows (NVLink here, a small share of a micro-step).
TEST(Replay, PipelineStagesIdleForOneFOneBsBubble) {
  ModelSpec m = *model_from_shape(8, 2048, 16, 1024, 512);  // a small vocabulary: balanced stages
  HardwareProfile p = *load_profile("dgx2");
  Placement pl = *preset("data_parallel");
  const int micro = 8;
  double t[5] = {0, 0, 0, 0, 0};
  for (int pp : {1, 2, 4}) {
    TrainingConfig c;
    c.seq = m.seq;
    c.bsz = 1;
    c.dp = 1;
    c.pp = pp;
    c.grad_accum = micro;
    Result<SimReport> r = simulate_isolated(m, pl, c, p, SimOptions{});
    ASSERT_TRUE(r.ok()) << r.error();
    ASSERT_FALSE(r->overflow);
    EXPECT_EQ(r->gpus, pp);
    EXPECT_FALSE(r->full);
    EXPECT_EQ(r->ranks_simulated, pp);
    t[pp] = r->iteration_s;
  }
  for (int pp : {2, 4})
    EXPECT_NEAR(t[pp] / t[1], double(micro + pp - 1) / (double(pp) * micro), 0.03) << "pp " << pp;
}

// Interleaved 1F1B (issue 28, item 3), one GPU per stage: the same pipeline with each stage's
// blocks in v chunks idles for (p - 1) / v micro-steps' time, so m micro-steps take
// (m + (p - 1) / v) / (p m) of one GPU's time for them, at v times the activation messages (NVLink
// here, a small share of a micro-step).
TEST(Replay, InterleavedStagesDivideTheBubbleByV) {
  ModelSpec m = *model_from_shape(16, 2048, 16, 1024, 512);  // a small vocabulary: balanced stages
  HardwareProfile p = *load_profile("dgx2");
  Placement pl = *preset("data_parallel");
  const int micro = 8, pp = 4;
  auto iteration = [&](int stages, int v) {
    TrainingConfig c;
    c.seq = m.seq;
    c.bsz = 1;
    c.dp = 1;
    c.pp = stages;
    c.virtual_stages = v;
    c.grad_accum = micro;
    Result<SimReport> r = simulate_isolated(m, pl, c, p, SimOptions{});
    EXPECT_TRUE(r.ok()) << r.error();
    if (!r.ok()) return 0.0;
    EXPECT_FALSE(r->overflow);
    EXPECT_EQ(r->virtual_stages, v);
    EXPECT_EQ(r->ranks_simulated, stages);
    return r->iteration_s;
  };
  const double one = iteration(1, 1);
  for (int v : {1, 2, 4}) {
    const double t = iteration(pp, v);
    EXPECT_NEAR(t / one, (micro + double(pp - 1) / v) / (double(pp) * micro), 0.005) << "v " << v;
  }
}

// --no-overlap with stages: each step of a stage waits for the one before it, but sends and
// receives are posted and the stage goes on (Megatron's batched isend and irecv); one that waited
// for its peer deadlocked 1F1B ("some steps never became ready"), plain and interleaved. With every state on the GPU only
// the sends' and receives' flows leave the compute, so the serial iteration is the overlapped one
// plus at most those messages.
TEST(Replay, WithoutOverlapPipelineStagesStillMeet) {
  ModelSpec m = *model_from_shape(16, 2048, 16, 1024, 512);
  const HardwareProfile p = *load_profile("dgx2");
  const Placement pl = *preset("data_parallel");
  for (int v : {1, 2})
    for (bool full : {false, true}) {
      SCOPED_TRACE("v " + std::to_string(v) + (full ? ", full" : ""));
      TrainingConfig c;
      c.seq = m.seq;
      c.bsz = 1;
      c.dp = 1;
      c.pp = 4;
      c.virtual_stages = v;
      c.grad_accum = 8;
      SimOptions o;
      o.full = full;
      const Result<SimReport> overlapped = simulate_isolated(m, pl, c, p, o);
      o.overlap = false;
      const Result<SimReport> serial = simulate_isolated(m, pl, c, p, o);
      ASSERT_TRUE(overlapped.ok()) << overlapped.error();
      ASSERT_TRUE(serial.ok()) << serial.error();
      EXPECT_GE(serial->iteration_s, overlapped->iteration_s * (1 - 1e-9));
      EXPECT_LT(serial->iteration_s, overlapped->iteration_s * 1.05);
    }
}

// Gradient clipping with stages: the norm's last exchange is over the stages, so the last stage
// (whose backward ends first under 1F1B) starts its updates only after the first stage's last
// gradient; without clipping it starts before. The stages meet in one collective, in the replay of
// one GPU per stage and in the full one alike.
TEST(Replay, TheNormOverStagesHoldsEveryStagesUpdatesUntilTheLastGradient) {
  ModelSpec m = *model_from_shape(8, 1024, 16, 256, 1000);
  m.tied_embeddings = false;  // (a tied one holds the last stage's updates too: the test below)
  const HardwareProfile p = *load_profile("dgx2");
  const Placement pl = *preset("zero3");
  double iteration[2][2] = {{0, 0}, {0, 0}};
  for (bool full : {false, true})
    for (int clip : {0, 1}) {
      SCOPED_TRACE(std::string(full ? "full" : "one GPU per stage") + (clip ? ", clipped" : ""));
      TrainingConfig c;
      c.seq = m.seq;
      c.bsz = 1;
      c.dp = 2;
      c.pp = 2;
      c.grad_accum = 4;
      c.grad_clip = clip;
      SimOptions o;
      o.trace = true;
      o.full = full;
      Result<std::vector<Schedule>> stages = build_schedules(m, pl, c, p);
      ASSERT_TRUE(stages.ok()) << stages.error();
      Result<SimReport> r = simulate_isolated(m, pl, c, p, o);
      ASSERT_TRUE(r.ok()) << r.error();
      EXPECT_EQ(r->full, full);
      iteration[full][clip] = r->iteration_s;
      double first_backward_end = 0, last_update_start = 1e30;
      for (const TraceEvent& e : r->trace) {
        const int stage = e.rank / 2;  // dp 2 GPUs per stage
        const Step& st = (*stages)[size_t(stage)].steps[size_t(e.step)];
        if (stage == 0 && st.phase == Phase::backward) first_backward_end = std::max(first_backward_end, e.end_s);
        if (stage == 1 && st.kind == StepKind::optimizer) last_update_start = std::min(last_update_start, e.start_s);
      }
      ASSERT_GT(first_backward_end, 0);
      ASSERT_LT(last_update_start, 1e30);
      if (clip) EXPECT_GE(last_update_start, first_backward_end);
      else EXPECT_LT(last_update_start, first_backward_end);
    }
  // the one-GPU-per-stage replay stands for the full one
  EXPECT_NEAR(iteration[0][1] / iteration[1][1], 1.0, 0.02);
}

// A tied embedding's copies on the first and last stage are summed in one collective of the two
// stages' GPUs: it starts at the same moment on both (once the later of them reaches it), in the
// replay of one GPU per stage and in the full one, which agree.
TEST(Replay, TheTiedEmbeddingsCopiesMeetAcrossStages) {
  const ModelSpec m = *model_from_shape(6, 1024, 16, 256, 1000);  // tied, as the paper's GPT
  ASSERT_TRUE(m.tied_embeddings);
  const HardwareProfile p = *load_profile("dgx2");
  double iteration[2] = {0, 0};
  for (bool full : {false, true}) {
    SCOPED_TRACE(full ? "full" : "one GPU per stage");
    TrainingConfig c;
    c.seq = m.seq;
    c.bsz = 1;
    c.dp = 2;
    c.pp = 3;
    c.grad_accum = 4;
    SimOptions o;
    o.trace = true;
    o.full = full;
    Result<SimReport> r = simulate_isolated(m, *preset("zero3"), c, p, o);
    ASSERT_TRUE(r.ok()) << r.error();
    iteration[full] = r->iteration_s;
    std::map<int, double> start;  // stage -> when its sum started
    for (const TraceEvent& e : r->trace)
      if (e.name == "allreduce.ar embed" && e.rank % 2 == 0) start[e.rank / 2] = e.start_s;
    ASSERT_EQ(start.size(), 2u);
    ASSERT_TRUE(start.count(0) && start.count(2));
    EXPECT_DOUBLE_EQ(start[0], start[2]);
  }
  EXPECT_NEAR(iteration[0] / iteration[1], 1.0, 0.02);
}

// Stages that straddle nodes (6 or 24 GPUs on nodes of 16): one GPU cannot stand for its stage,
// so every GPU is replayed; beyond what the full replay takes (384 GPUs) the message says why.
TEST(Replay, StagesThatDoNotTileTheNodesAreReplayedInFullOrRefused) {
  const ModelSpec m = *model_from_shape(16, 256, 4, 64, 512);
  auto stages = [&](int dp, int pp) {  // mp 2, one micro-batch per stage
    TrainingConfig c;
    c.seq = m.seq;
    c.mp = 2;
    c.dp = dp;
    c.pp = c.grad_accum = pp;
    return c;
  };
  Result<SimReport> all =
      simulate_isolated(m, *preset("three_d"), stages(3, 4), *scale_to_nodes(*load_profile("dgx2"), 2), SimOptions{});
  ASSERT_TRUE(all.ok()) << all.error();
  EXPECT_TRUE(all->full);
  EXPECT_EQ(all->ranks_simulated, 24);
  Result<SimReport> r =
      simulate(m, *preset("three_d"), stages(12, 16), *scale_to_nodes(*load_profile("dgx2"), 24), SimOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--pp 16 with stages of 24 GPUs (dp x mp) that do not tile nodes of 16"), std::string::npos)
      << r.error();
}

TEST(Replay, ScheduleThatDoesNotFitIsNotSimulated) {
  Result<SimReport> r = simulate(*load_model("table1-1T"), *preset("zero3"), TrainingConfig{}, *load_profile("dgx2"),
                                 SimOptions{});
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_TRUE(r->overflow.has_value());
  EXPECT_EQ(r->overflow->tier, Tier::gpu);
  EXPECT_EQ(r->iteration_s, 0);
}

// gpu.shared_peak (issue 28 item 8): GPUs that are one compute resource (the cpu backend's devices,
// this machine's cores) run at gpu.peak alone and split the node's shared rate when they compute
// together. Two data-parallel ranks compute in step, so with a shared rate of one GPU's peak each
// computes at half its peak: the compute doubles; with twice the peak (no contention) nothing
// changes; and every GPU is replayed, as the split depends on when each computes.
// Two blocks of hidden 1024 where only compute costs time (every link and rate unlimited, one
// peak for every hidden size), replayed without overlap: the compute-rate tests below.
struct ComputeOnly {
  ModelSpec m = *model_from_shape(2, 1024, 16, 256, 1000);
  HardwareProfile p = unlimited_but("none");
  TrainingConfig c;
  SimOptions o;
  explicit ComputeOnly(int dp) {
    p.gpu_gpu_Bps = kHuge;
    p.peak_by_hidden.clear();
    c.dp = dp;
    c.seq = m.seq;
    c.bsz = 4;
    o.overlap = false;
  }
};

TEST(Replay, GpusSharingTheirComputeSplitItWhenTheyComputeTogether) {
  ComputeOnly x(2);
  const ModelSpec& m = x.m;
  const HardwareProfile& p = x.p;
  TrainingConfig& c = x.c;
  const SimOptions& o = x.o;
  Result<SimReport> alone = simulate_isolated(m, *preset("data_parallel"), c, p, o);
  ASSERT_TRUE(alone.ok()) << alone.error();
  ASSERT_FALSE(alone->full);
  const double compute = alone->phase_end_s.at("bwd");  // forward + backward, nothing exposed
  for (double share : {1.0, 2.0}) {
    HardwareProfile q = p;
    q.gpu_shared_peak_flops_per_s = share * p.gpu_peak_flops_per_s;
    Result<SimReport> r = simulate_isolated(m, *preset("data_parallel"), c, q, o);
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_TRUE(r->full) << "every GPU replayed";
    EXPECT_EQ(r->ranks_simulated, 2);
    // (within 3 %: the gradients' all-reduce latencies in backward, under 1 % of it, do not double)
    EXPECT_NEAR(r->phase_end_s.at("bwd") / compute, 2.0 / share, 0.03) << "shared peak " << share << " x gpu.peak";
  }
  // one rank alone on the node computes at gpu.peak, whatever the shared rate
  HardwareProfile q = p;
  q.gpu_shared_peak_flops_per_s = p.gpu_peak_flops_per_s;
  c.dp = 1;
  Result<SimReport> one = simulate_isolated(m, *preset("data_parallel"), c, q, o);
  Result<SimReport> one_plain = simulate_isolated(m, *preset("data_parallel"), c, p, o);
  ASSERT_TRUE(one.ok() && one_plain.ok());
  EXPECT_NEAR(one->iteration_s / one_plain->iteration_s, 1.0, 1e-6);
}

// gpu.gemm (issue 28 item 2): a linear layer is costed at the rate measured for its GEMM's shape, so
// tiling, whose tiles are thinner GEMMs, costs what their rate says: with the tiles' shapes measured
// at half the whole layers' rate, the linear layers' compute doubles; with no gpu.gemm tiling
// costs nothing.
TEST(Replay, TiledLinearLayersRunAtTheirTilesRate) {
  const ComputeOnly x(1);
  const ModelSpec& m = x.m;
  const HardwareProfile& p = x.p;
  const TrainingConfig& c = x.c;
  const SimOptions& o = x.o;
  auto iteration = [&](const HardwareProfile& q, int tiling) {
    TrainingConfig k = c;
    k.tiling_factor = tiling;
    Result<SimReport> r = simulate_isolated(m, *preset("data_parallel"), k, q, o);
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() ? r->iteration_s : 0.0;
  };
  const double untiled = iteration(p, 1);
  EXPECT_NEAR(iteration(p, 2) / untiled, 1.0, 1e-9);
  HardwareProfile q = p;
  const long tokens = 4 * 256;
  for (OpRole role : {OpRole::qkv, OpRole::proj, OpRole::fc1, OpRole::fc2})
    for (int tiles : {1, 2}) {  // (at tiling 4 an fc1 tile is proj's shape)
      const GemmShape g = linear_gemm_shape(m, role, tokens, 1, tiles);
      q.gemm.push_back({g.m, g.n, g.k, tiles == 1 ? p.gpu_peak_flops_per_s : p.gpu_peak_flops_per_s / 2});
    }
  EXPECT_NEAR(iteration(q, 1) / untiled, 1.0, 1e-6);  // whole layers measured at the peak
  // the tiles' FLOPs (forward, recompute, backward) take twice as long; the rest is unchanged
  TrainingConfig tiled = c;
  tiled.tiling_factor = 2;
  Result<Schedule> s = build_schedule(m, *preset("data_parallel"), tiled, p);
  ASSERT_TRUE(s.ok());
  double linear = 0;
  for (const Step& st : s->steps)
    if (st.kind == StepKind::compute && st.tile >= 0) linear += st.flops;
  const double linear_s = linear / p.gpu_peak_flops_per_s;
  EXPECT_NEAR(iteration(q, 2) - untiled, linear_s, 0.02 * linear_s);
}

// A datasheet profile (gpu.sms, no measured GEMMs): every linear layer, whole or tiled, at the
// tile-and-wave model's rate for its own shape; the other operators at the peak. 1024 tokens of a
// hidden-1024 layer fill 96 of 108 SMs untiled, 24 as quarter tiles.
TEST(Replay, DatasheetProfilesCostEachLinearLayerAtItsShape) {
  const ComputeOnly x(1);
  const ModelSpec& m = x.m;
  HardwareProfile q = x.p;
  q.gpu_sms = 108;
  for (int tiling : {1, 4}) {
    SCOPED_TRACE(tiling);
    TrainingConfig k = x.c;
    k.tiling_factor = tiling;
    Result<SimReport> flat = simulate_isolated(m, *preset("data_parallel"), k, x.p, x.o);
    Result<SimReport> shaped = simulate_isolated(m, *preset("data_parallel"), k, q, x.o);
    ASSERT_TRUE(flat.ok() && shaped.ok());
    Result<Schedule> s = build_schedule(m, *preset("data_parallel"), k, q);
    ASSERT_TRUE(s.ok());
    double extra = 0;  // what each linear compute takes beyond its FLOPs at the peak
    for (const Step& st : s->steps) {
      if (st.kind != StepKind::compute || st.op < 0 || s->ops[size_t(st.op)].kind != OpKind::linear) continue;
      const GemmShape g = linear_gemm_shape(m, s->ops[size_t(st.op)].role, long(k.bsz) * k.seq, 1, st.tile >= 0 ? tiling : 1);
      extra += st.flops / q.gemm_rate(g.m, g.n, g.k) - st.flops / q.gpu_peak_flops_per_s;
    }
    EXPECT_GT(extra, 0);
    EXPECT_NEAR(shaped->iteration_s - flat->iteration_s, extra, 0.01 * extra);
  }
}

// Expert parallelism (issue 27): a mixture of experts' token all-to-all, replayed. With every state
// on the GPU (data_parallel) nothing else crosses NVSwitch in forward, so each forward all-to-all
// takes its closed form on idle links, (ep - 1)/ep x its send buffer (tokens x top-2 x hidden, fp16)
// over a GPU's NVSwitch port plus one route latency; the full replay agrees with the symmetric one.
// Prefetch depth 0 fetches on demand, as ZeRO-3 did in DeepSpeed v0.3.15 to v0.5.10 (issue #1069):
// no copy to the GPU or all-gather of a parameter overlaps a compute, so the forward pass lasts
// the serial sum of its computes and its fetches. At the default depth the fetches run beside the
// computes and the forward pass is shorter than that sum. 16 GPUs share the node's PCIe (3 GB/s each).
TEST(Replay, PrefetchDepthZeroFetchesOnDemand) {
  ModelSpec m = model();
  for (int depth : {0, 3}) {
    const std::optional<Traced> r = traced_zero_inf_cpu(m, [&](TrainingConfig& c) { c.prefetch_depth = depth; });
    ASSERT_TRUE(r);
    const Schedule* s = &r->schedule;
    Intervals computes, fetches;
    for (const TraceEvent& e : r->report.trace) {
      const Step& st = s->steps.at(size_t(e.step));
      if (e.rank != 0 || st.phase != Phase::forward) continue;
      if (st.kind == StepKind::compute) computes.push_back({e.start_s, e.end_s});
      if (st.kind == StepKind::fetch && (st.hop == Hop::cg || st.hop == Hop::gg)) fetches.push_back({e.start_s, e.end_s});
    }
    ASSERT_GT(computes.size(), 10u);
    ASSERT_GT(fetches.size(), 10u);
    // the time covered by a set of intervals, and by two sets' intersections
    auto covered = [](Intervals v) {
      std::sort(v.begin(), v.end());
      double total = 0, from = -1, to = -1;
      for (auto [a, b] : v) {
        if (a > to) total += to - from, from = a, to = b;
        else to = std::max(to, b);
      }
      return total + to - from;
    };
    const double both = intersection_s(computes, fetches);
    const double compute = covered(computes), fetch = covered(fetches);
    double first = 1e300, last = 0;
    for (const auto& v : {computes, fetches})
      for (auto [a, b] : v) first = std::min(first, a), last = std::max(last, b);
    ASSERT_GT(fetch, 0.05 * compute) << "the fetches must cost time for this test to mean anything";
    if (depth == 0) {
      EXPECT_LT(both, 1e-6 * compute) << "a fetch overlapped a compute";
      EXPECT_NEAR((last - first) / (compute + fetch), 1.0, 1e-3);
    } else {
      EXPECT_GT(both, 0.5 * fetch) << "most of the fetching should hide behind the computes";
      EXPECT_LT(last - first, compute + 0.5 * fetch);
    }
  }
}

// sync_fetches: ZeRO-3 as DeepSpeed v0.3.15-v0.5.x ran it, torch.cuda.synchronize() before each
// parameter's all-gather (partition_parameters.py) and every all-gather in flight waited for before
// a module's compute. At the default prefetch depth, no copy to the GPU or all-gather of a
// parameter then overlaps a compute, and each starts only once every earlier step of its rank's
// device work has ended: the gradients' reduce-scatters and copies to CPU memory too. Without it
// the fetches hide behind the computes and start while earlier reduce-scatters still run.
TEST(Replay, SyncFetchesWaitForAllOfTheRanksEarlierDeviceWork) {
  ModelSpec m = model();
  for (bool sync : {true, false}) {
    const std::optional<Traced> r = traced_zero_inf_cpu(m, [&](TrainingConfig& c) { c.sync_fetches = sync; });
    ASSERT_TRUE(r);
    const Schedule* s = &r->schedule;
    std::map<int, std::pair<double, double>> at;  // rank 0's steps: the first start, the last end
    for (const TraceEvent& e : r->report.trace) {
      if (e.rank != 0) continue;
      auto [it, fresh] = at.try_emplace(e.step, e.start_s, e.end_s);
      if (!fresh) it->second = {std::min(it->second.first, e.start_s), std::max(it->second.second, e.end_s)};
    }
    auto is_fetch = [](const Step& st) {
      return st.kind == StepKind::fetch && st.state == State::param16 && (st.hop == Hop::cg || st.hop == Hop::gg);
    };
    Intervals computes, fetches;
    double late = 0;  // how long fetches started before the end of an earlier reduce-scatter or copy of a gradient
    double last_end = 0;   // of the earlier gradient reduce-scatters and copies to the CPU, in step order
    for (const auto& [id, t] : at) {
      const Step& st = s->steps.at(size_t(id));
      if (st.kind == StepKind::compute) computes.push_back(t);
      if (is_fetch(st)) {
        fetches.push_back(t);
        late += std::max(0.0, last_end - t.first);
      }
      if (st.kind == StepKind::reduce_scatter || (st.kind == StepKind::offload && st.hop == Hop::gc))
        last_end = std::max(last_end, t.second);
    }
    ASSERT_GT(fetches.size(), 10u);
    double fetching = 0;
    for (auto [a, b] : fetches) fetching += b - a;
    const double both = intersection_s(computes, fetches);
    if (sync) {
      EXPECT_LT(both, 1e-6 * fetching) << "a fetch overlapped a compute";
      EXPECT_LT(late, 1e-9) << "a fetch started before an earlier gradient reduce-scatter or copy ended";
    } else {
      // prefetched, much of the fetching hides behind the computes (in backward the all-gathers queue
      // behind the gradients' reduce-scatters on the data-parallel group's one stream: 45 %)
      EXPECT_GT(both, 0.3 * fetching) << "prefetched: much of the fetching hides behind the computes";
      EXPECT_GT(late, 0) << "without the synchronize a fetch need not wait for the gradients";
    }
  }
}

// One NCCL stream per communicator (SimOptions::one_stream): a rank's collectives of one group run
// one at a time, in the order the rank issues them, as memwall's executor and PyTorch's
// ProcessGroupNCCL run them. ZeRO-3 on two DGX-2s: in backward the gradients' reduce-scatters and
// the next parameters' prefetched all-gathers both go over the data-parallel group. With one stream
// no two of rank 0's overlap and each starts after every one issued before it has ended; without it
// some run at once (else this test would prove nothing).
TEST(Replay, ACommunicatorsCollectivesRunOneAtATimeInIssueOrder) {
  ModelSpec m = model();
  const HardwareProfile p = *scale_to_nodes(*load_profile("dgx2"), 2);
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 2;
  c.dp = 32;
  const Placement pl = *preset("zero3");
  Result<Schedule> s = build_schedule(m, pl, c, p);
  ASSERT_TRUE(s) << s.error();
  for (bool one : {true, false}) {
    SimOptions o;
    o.trace = true;
    o.one_stream = one;
    Result<SimReport> r = simulate_isolated(m, pl, c, p, o);
    ASSERT_TRUE(r) << r.error();
    std::map<int, std::pair<double, double>> at;  // rank 0's collective steps: the first start, the last end
    for (const TraceEvent& e : r->trace) {
      const Step& st = s->steps.at(size_t(e.step));
      if (e.rank != 0 || !is_collective(st) || st.collective.group != CommGroup::dp) continue;
      auto [it, fresh] = at.try_emplace(e.step, e.start_s, e.end_s);
      if (!fresh) it->second = {std::min(it->second.first, e.start_s), std::max(it->second.second, e.end_s)};
    }
    ASSERT_GT(at.size(), 20u);
    Intervals all;
    double early = 0, last_end = 0;  // how long collectives started before an earlier-issued one ended
    for (const auto& [id, t] : at) {  // in step order: the order the rank issues them
      all.push_back(t);
      early += std::max(0.0, last_end - t.first);
      last_end = std::max(last_end, t.second);
    }
    double busy = 0;
    for (auto [a, b] : all) busy += b - a;
    if (one) {
      EXPECT_LT(overlap_within_s(all), 1e-9 * busy) << "two collectives of the data-parallel group ran at once";
      EXPECT_LT(early, 1e-9 * busy) << "a collective started before one issued earlier had ended";
    } else {
      EXPECT_GT(overlap_within_s(all), 1e-3 * busy) << "without one stream some collectives must run at once";
    }
  }
}

// A long replay says how far it got (SimOptions::progress; `memwall simulate` prints it): the
// activities done only grow, never beyond all of them, and the simulated time only moves forward
// and stays within the iteration; the first report, (0, 0, 0), comes before the replay is built.
// Interval 0: every 256 activities, whatever the machine's speed.
TEST(Replay, ProgressOnlyMovesForward) {
  const ModelSpec m = *load_model("table1-10B");  // thousands of activities
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 2;
  c.dp = 16;
  std::vector<std::array<double, 3>> heard;  // done, total, simulated seconds
  SimOptions o;
  o.progress_interval_s = 0;
  o.progress = [&](std::size_t done, std::size_t total, double simulated_s) {
    heard.push_back({double(done), double(total), simulated_s});
  };
  Result<SimReport> r = simulate(m, *preset("zero_inf_cpu"), c, *load_profile("dgx2"), o);
  ASSERT_TRUE(r) << r.error();
  ASSERT_GT(heard.size(), 3u);
  EXPECT_EQ(heard[0], (std::array<double, 3>{0, 0, 0}));
  for (size_t i = 1; i < heard.size(); ++i) {
    EXPECT_GT(heard[i][1], 0);
    EXPECT_EQ(heard[i][1], heard[1][1]);
    EXPECT_LE(heard[i][0], heard[i][1]);
    EXPECT_LE(heard[i][2], r->iteration_s * (1 + 1e-9));
    if (i == 1) continue;
    EXPECT_GT(heard[i][0], heard[i - 1][0]);
    EXPECT_GE(heard[i][2], heard[i - 1][2]);
  }
}

// ZeRO-Offload's owner scheme (Sec. 6.1) as DeepSpeed's stage 2 of the paper's time ran it
// (sync_grad_copies): each gradient is reduced to the rank that owns it, which copies it to CPU
// memory before its next backward compute, and the others wait for it in the next reduce. So the
// copies go one rank at a time, the whole model's gradients over one PCIe link (12 GB/s on a DGX-2
// with 4 GPUs busy): "limited by single PCIe bandwidth" (Fig. 8), "one rank at a time"
// (microsoft/DeepSpeed PR #1067). ZeRO-Infinity's all-gather scheme copies every rank's 1/dp of
// each gradient at once.
TEST(Replay, ZeroOffloadOwnersCopyGradientsOneRankAtATime) {
  ModelSpec m = model();
  const HardwareProfile p = *load_profile("dgx2");
  for (ParamFetch fetch : {ParamFetch::broadcast, ParamFetch::allgather}) {
    TrainingConfig c;
    c.seq = m.seq;
    c.bsz = 2;
    c.dp = 4;
    c.sync_grad_copies = true;
    Placement pl = *preset("zero_offload");
    pl.fetch = fetch;
    SimOptions o;
    o.trace = true;
    o.full = true;  // every rank's copies (the owner scheme is replayed in full anyway: its ranks differ)
    Result<SimReport> r = simulate_isolated(m, pl, c, p, o);
    ASSERT_TRUE(r.ok()) << r.error();
    Intervals copies;
    double copying = 0;
    for (const TraceEvent& e : r->trace)
      if (e.name.starts_with("offload.gc ")) {
        copies.push_back({e.start_s, e.end_s});
        copying += e.end_s - e.start_s;
      }
    const double overlap = overlap_within_s(copies);
    const double grad_bytes = 2.0 * model_param_count(m);  // fp16 gradients, every one copied once (by its owner or in parts)
    if (fetch == ParamFetch::broadcast) {
      ASSERT_GE(copies.size(), size_t(6 * m.layers));
      EXPECT_LT(overlap, 1e-6 * copying) << "two owners copied at once";
      EXPECT_NEAR(copying / (grad_bytes / 12e9), 1.0, 0.02) << "the whole model over one link";
    } else {
      EXPECT_GT(overlap, 0.5 * copying) << "the ranks' parts should go at once";
      EXPECT_GE(copying, 0.99 * grad_bytes / 12e9) << "4 x 1/4 of the model, each over its own link";
    }
  }
}

TEST(Replay, ExpertAllToAllTakesItsClosedForm) {
  ModelSpec m = *model_from_shape(2, 1024, 8, 1024, 1024);
  m.ffn = FfnKind::swiglu;
  m.moe = {8, 2, 1024, 0};
  const HardwareProfile p = *load_profile("dgx2");
  TrainingConfig c;
  c.seq = 1024;
  c.bsz = 2;
  c.dp = 16;
  c.ep = 8;
  SimOptions o;
  o.trace = true;
  Result<SimReport> r = simulate_isolated(m, *preset("data_parallel"), c, p, o);
  ASSERT_TRUE(r.ok()) << r.error();
  const double send = 2.0 * c.bsz * c.seq * 2 * m.hidden;
  const CollectiveOp op{Collective::all_to_all, send, {8, 8}, 0};
  const double expected = closed_form_s(op, Algorithm::direct, {p.gpu_gpu_Bps, 2 * kLinkLatency_s, 1, 0});
  int seen = 0;
  for (const TraceEvent& e : r->trace)
    if (e.name.starts_with("all_to_all.a2a block0.router") && e.rank == 0 && e.start_s < r->phase_end_s.at("fwd")) {
      EXPECT_NEAR((e.end_s - e.start_s) / expected, 1.0, 1e-3) << e.name;
      ++seen;
    }
  EXPECT_EQ(seen, 1);
  SimOptions full = o;
  full.full = true;
  full.trace = false;
  Result<SimReport> f = simulate_isolated(m, *preset("data_parallel"), c, p, full);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_NEAR(f->iteration_s / r->iteration_s, 1.0, 0.01);
}

}  // namespace
}  // namespace memwall::sim
