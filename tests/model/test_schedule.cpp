// The schedule against its invariants and the closed form: every preset on small and paper-sized
// models, per-link traffic, tiling, checkpoint interval, out-of-memory reporting, a golden dump.
#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "model/analysis.hpp"
#include "model/memory_plan.hpp"
#include "model/schedule.hpp"

namespace memwall {
namespace {

ModelSpec tiny() { return *model_from_shape(2, 256, 4, 64, 512); }
HardwareProfile dgx2() { return *load_profile("dgx2"); }

Schedule make(const ModelSpec& m, const std::string& strategy, TrainingConfig c, const HardwareProfile& p,
              int rank = 0) {
  c.seq = m.seq;
  Placement pl = *preset(strategy);
  if (strategy == "l2l" && c.micro_batches == 1) c.micro_batches = 4;
  Result<Schedule> s = build_schedule(m, pl, c, p, rank);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error());
  return s.ok() ? *s : Schedule{};
}

double sum_bytes(const Schedule& s, StepKind k, State st, Hop hop = Hop::none) {
  double b = 0;
  for (const Step& x : s.steps)
    if (x.kind == k && x.state == st && (hop == Hop::none || x.hop == hop)) b += x.bytes;
  return b;
}

TEST(OperatorGraph, LinearFlopsAreEq7AndAttentionIsExtra) {
  for (const char* name : {"fig2a-1T", "table8-h2K"}) {
    ModelSpec m = *load_model(name);
    OperatorGraph g = build_gpt_graph(m, 2, 1024);
    EXPECT_DOUBLE_EQ(g.linear_weight_elems(), params_eq1(m.layers, m.hidden)) << name;
    EXPECT_NEAR(g.linear_flops() / computation_flops_eq7(2, 1024, params_eq1(m.layers, m.hidden)), 1.0, 1e-12);
    // Attention (2·B·T²·C twice per block, fwd + bwd + recompute) is what Eq. 7 leaves out.
    EXPECT_DOUBLE_EQ(g.attention_flops(), m.layers * 2 * (2.0 * 2 * 1024.0 * 1024 * m.hidden) * 4);
    EXPECT_GT(g.other_flops(), g.attention_flops());  // plus the LM head and elementwise work
  }
}

TEST(OperatorGraph, HasEveryOperatorInDependencyOrder) {
  ModelSpec m = tiny();
  OperatorGraph g = build_gpt_graph(m, 1, 64);
  EXPECT_EQ(g.size(), 1u + m.layers * 11u + 2u);  // embed, 11 per block, ln_f, lm_head
  std::vector<size_t> pos(g.size());
  for (size_t i = 0; i < g.order.size(); ++i) pos[g.order[i]] = i;
  for (auto e : boost::make_iterator_range(boost::edges(g.graph)))
    EXPECT_LT(pos[boost::source(e, g.graph)], pos[boost::target(e, g.graph)]);
  EXPECT_EQ(g.op(g.order.front()).name, "embed");
  EXPECT_EQ(g.op(g.order.back()).name, "lm_head");
  EXPECT_EQ(g.op(g.order.back()).param_owner, "embed");  // tied: the external parameter
}

TEST(Schedule, EveryPresetKeepsItsInvariants) {
  HardwareProfile p = dgx2();
  for (const std::string& name : preset_names())
    for (const char* model : {"tiny", "table1-1T"}) {
      ModelSpec m = std::string(model) == "tiny" ? tiny() : *load_model(model);
      TrainingConfig c;
      c.mp = name == "three_d" ? 4 : 1;
      c.tiling_factor = 2;
      Schedule s = make(m, name, c, p);
      std::vector<std::string> bad = check_invariants(s);
      EXPECT_TRUE(bad.empty()) << name << " " << model << ": " << (bad.empty() ? "" : bad.front());
      EXPECT_GT(s.steps.size(), 10u);
    }
}

TEST(Schedule, OneTrillionFitsOnOneDgx2OnlyWithNvme) {
  HardwareProfile p = dgx2();
  ModelSpec m = *load_model("table1-1T");
  for (const std::string& name : preset_names()) {
    TrainingConfig c;
    c.mp = name == "three_d" ? 4 : 1;
    Schedule s = make(m, name, c, p);
    EXPECT_EQ(!s.overflow.has_value(), name == "zero_inf_nvme") << name << ": "
                                                                 << (s.overflow ? s.overflow->message : "fits");
  }
}

// Sec. 4.1: parameters cross the all-gather three times (forward, recompute, backward); the tied
// embedding twice per pass (embed and lm_head) and ln_f twice (it is not recomputed). Gradients
// are reduce-scattered once. Optimizer states are read and written once.
TEST(Schedule, TrafficEqualsTheClosedForm) {
  HardwareProfile p = dgx2();
  ModelSpec m = tiny();
  OperatorGraph g = build_gpt_graph(m, 1, m.seq);
  double blocks = 0, embed = 0, lnf = 0;
  for (size_t v : g.order) {
    const Operator& o = g.op(v);
    (o.block >= 0 ? blocks : o.name == "embed" ? embed : lnf) += 2 * o.param_elems;
  }
  const double all = blocks + embed + lnf;
  for (int dp : {2, 4, 16}) {
    TrainingConfig c;
    c.dp = dp;
    Schedule s = make(m, "zero_inf_nvme", c, p);
    const double gathered = (3 * blocks + 2 * lnf + 4 * embed) * (dp - 1) / dp;
    EXPECT_NEAR(sum_bytes(s, StepKind::fetch, State::param16, Hop::gg), gathered, 1e-6 * gathered) << dp;
    EXPECT_NEAR(sum_bytes(s, StepKind::fetch, State::param16, Hop::nc), (3 * blocks + 2 * lnf + 4 * embed) / dp, 1e-3);
    EXPECT_NEAR(sum_bytes(s, StepKind::reduce_scatter, State::grad16), all * (dp - 1) / dp, 1e-3);
    EXPECT_NEAR(sum_bytes(s, StepKind::offload, State::grad16, Hop::gc), all / dp, 1e-3);
    // the 12 B of fp32 parameter, momentum and variance read and written; the 16-bit gradient read
    EXPECT_NEAR(sum_bytes(s, StepKind::fetch, State::optim32), 6 * all / dp, 1e-3);
    EXPECT_NEAR(sum_bytes(s, StepKind::offload, State::optim32), 6 * all / dp, 1e-3);
    EXPECT_NEAR(sum_bytes(s, StepKind::fetch, State::grad16, Hop::nc), all / dp, 1e-3);
    EXPECT_NEAR(s.traffic_bytes[int(LinkClass::gpu_gpu)], gathered + all * (dp - 1) / dp, 1e-3);
    EXPECT_EQ(s.traffic_bytes[int(LinkClass::network)], 0);
  }
}

// Eq. 2 counts 16 B of fp32 optimizer state per parameter, the gradient among them, and Eq. 10 moves
// all 16 both ways. The fp32 gradient is made from the 16-bit one at every step, so it takes its
// room on NVMe and in the chunk buffers but crosses to NVMe neither way: DeepSpeed's
// PartitionedOptimizerSwapper writes back the fp32 parameter, exp_avg and exp_avg_sq only. With
// MemorySizes::optim_grad_bytes 0 (optim_bytes without a gradient in them) every byte crosses.
TEST(Schedule, OptimizerSwapsItsStatesNotTheirFp32Gradient) {
  HardwareProfile p = dgx2();
  ModelSpec m = tiny();
  TrainingConfig c;
  c.dp = 4;
  c.seq = m.seq;
  const Placement pl = *preset("zero_inf_nvme");
  MemorySizes all16;
  all16.optim_grad_bytes = 0;
  Schedule s = *build_schedule(m, pl, c, p), eq10 = *build_schedule(m, pl, c, p, 0, all16);
  const double n = s.persistent_bytes[int(Tier::nvme)][int(State::optim32)] / 16;  // this rank's partition
  ASSERT_GT(n, 0);
  EXPECT_DOUBLE_EQ(eq10.persistent_bytes[int(Tier::nvme)][int(State::optim32)], 16 * n);  // the same room
  EXPECT_NEAR(sum_bytes(s, StepKind::fetch, State::optim32), 12 * n, 1e-6 * n);
  EXPECT_NEAR(sum_bytes(s, StepKind::offload, State::optim32), 12 * n, 1e-6 * n);
  EXPECT_NEAR(sum_bytes(eq10, StepKind::fetch, State::optim32), 16 * n, 1e-6 * n);
  EXPECT_NEAR(sum_bytes(eq10, StepKind::offload, State::optim32), 16 * n, 1e-6 * n);
  // the chunk buffers still hold the gradient slot: the same memory either way
  EXPECT_DOUBLE_EQ(s.peak_bytes[int(Tier::cpu)], eq10.peak_bytes[int(Tier::cpu)]);
  EXPECT_TRUE(check_invariants(s).empty());
  for (double bad : {-1.0, 16.0}) {
    MemorySizes z;
    z.optim_grad_bytes = bad;
    Result<Schedule> r = build_schedule(m, pl, c, p, 0, z);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().find("fp32 gradient"), std::string::npos) << r.error();
  }
}

TEST(Schedule, BroadcastReadsWholeParametersThroughTheOwner) {
  HardwareProfile p = dgx2();
  ModelSpec m = tiny();
  Placement pl = *preset("zero_inf_cpu");
  pl.fetch = ParamFetch::broadcast;
  TrainingConfig c;
  c.dp = 4;
  c.seq = m.seq;
  double cg_total = 0, cg_largest = 0;
  for (int r = 0; r < 4; ++r) {
    Schedule s = *build_schedule(m, pl, c, p, r);
    EXPECT_TRUE(check_invariants(s).empty()) << check_invariants(s).front();
    for (const Step& x : s.steps)
      if (x.kind == StepKind::fetch && x.hop == Hop::cg && x.phase != Phase::optimizer) {
        cg_total += x.bytes;
        cg_largest = std::max(cg_largest, x.bytes);
      }
  }
  Schedule ag = make(m, "zero_inf_cpu", c, p);
  double ag_largest = 0;
  for (const Step& x : ag.steps)
    if (x.kind == StepKind::fetch && x.hop == Hop::cg) ag_largest = std::max(ag_largest, x.bytes);
  // The owners together read each parameter once per use, as all ranks together do under
  // bandwidth-centric partitioning, but each read is a whole parameter through one PCIe link
  // instead of 1/dp of it through every link.
  EXPECT_NEAR(cg_total, 4 * sum_bytes(ag, StepKind::fetch, State::param16, Hop::cg), 1e-3);
  EXPECT_NEAR(cg_largest, 4 * ag_largest, 1e-3);
}

TEST(Schedule, TilingDividesTheLargestParameterBuffer) {
  HardwareProfile p = dgx2();
  ModelSpec m = *load_model("table5-h64K");
  auto largest = [&](int tiling) {
    TrainingConfig c;
    c.tiling_factor = tiling;
    Schedule s = make(m, "zero_inf_nvme", c, p);
    double mx = 0;
    for (const Step& x : s.steps)
      if (x.kind == StepKind::release && x.name.find("fc1") != std::string::npos) mx = std::max(mx, x.bytes);
    return mx;
  };
  const double whole = largest(1);
  EXPECT_NEAR(whole, 2.0 * (65536.0 * 4 * 65536 + 4 * 65536), 1);  // fc1 fp16 weights + bias
  EXPECT_NEAR(largest(16), whole / 16, 1);
  EXPECT_NEAR(mswm_bytes_eq4(65536) / 2, 2.0 * 65536.0 * 4 * 65536, 1);  // MSWM = parameter + gradient
}

TEST(Schedule, CheckpointIntervalTwoHalvesCheckpointBytes) {
  HardwareProfile p = dgx2();
  ModelSpec m = *model_from_shape(8, 512, 8, 128, 1000);
  for (const char* strategy : {"zero3", "zero_inf_cpu"}) {
    TrainingConfig c1, c2;
    c2.ci = 2;
    Placement pl = *preset(strategy);
    pl.act_ckpt.tier = Tier::cpu;
    c1.seq = c2.seq = m.seq;
    Schedule s1 = *build_schedule(m, pl, c1, p), s2 = *build_schedule(m, pl, c2, p);
    EXPECT_DOUBLE_EQ(sum_bytes(s1, StepKind::save_ckpt, State::act_ckpt), act_ckpt_bytes_eq3(1, 128, 512, 8, 1));
    EXPECT_DOUBLE_EQ(sum_bytes(s2, StepKind::save_ckpt, State::act_ckpt),
                     sum_bytes(s1, StepKind::save_ckpt, State::act_ckpt) / 2);
    EXPECT_DOUBLE_EQ(sum_bytes(s2, StepKind::load_ckpt, State::act_ckpt),
                     sum_bytes(s2, StepKind::save_ckpt, State::act_ckpt));
    EXPECT_TRUE(check_invariants(s2).empty());
  }
}

TEST(Schedule, OverflowNamesTheStepAndTier) {
  HardwareProfile p = dgx2();
  p.gpu_memory_bytes = 16e9;  // the 64K layer's fc1 alone is 34 GB of fp16 weights
  ModelSpec m = *model_from_shape(1, 65536, 32, 1024, 1000);
  Schedule s = make(m, "zero_inf_nvme", TrainingConfig{}, p);
  ASSERT_TRUE(s.overflow.has_value());
  EXPECT_EQ(s.overflow->tier, Tier::gpu);
  ASSERT_GE(s.overflow->step, 0);
  EXPECT_NE(s.overflow->message.find("at step " + std::to_string(s.overflow->step)), std::string::npos)
      << s.overflow->message;
  // Tiling by 16 brings fc1 under the limit.
  TrainingConfig tiled;
  tiled.tiling_factor = 16;
  Schedule t = make(m, "zero_inf_nvme", tiled, p);
  EXPECT_FALSE(t.overflow.has_value()) << t.overflow->message;
}

TEST(Schedule, PrefetchRunsAhead) {
  HardwareProfile p = dgx2();
  ModelSpec m = tiny();
  auto distance = [&](int depth) {  // most computes between an nc fetch and the compute it feeds
    TrainingConfig c;
    c.prefetch_depth = depth;
    c.dp = 4;
    Schedule s = make(m, "zero_inf_nvme", c, p);
    std::map<std::pair<int, Phase>, int> issued;  // (unit, phase) -> computes before its nc
    int computes = 0, most = 0;
    for (const Step& x : s.steps) {
      if (x.kind == StepKind::fetch && x.hop == Hop::nc && x.unit >= 0) issued[{x.unit, x.phase}] = computes;
      if (x.kind == StepKind::compute) {
        ++computes;
        if (issued.count({x.unit, x.phase})) most = std::max(most, computes - issued[{x.unit, x.phase}]);
      }
    }
    return most;
  };
  EXPECT_EQ(distance(0), 1);
  EXPECT_GT(distance(3), 3);
}

TEST(Schedule, L2lRelaysEachLayerOnceForAllMicroBatches) {
  HardwareProfile p = dgx2();
  ModelSpec m = tiny();
  TrainingConfig c;
  c.micro_batches = 4;
  Schedule s = make(m, "l2l", c, p);
  int fwd_cg = 0, fwd_fc1 = 0;
  for (const Step& x : s.steps) {
    if (x.phase == Phase::forward && x.kind == StepKind::fetch && x.hop == Hop::cg) ++fwd_cg;
    if (x.phase == Phase::forward && x.kind == StepKind::compute && x.name == "block0.fc1") ++fwd_fc1;
  }
  EXPECT_EQ(fwd_cg, 3 + 6 * m.layers);  // embed, ln_f, lm_head (the tied embedding again) + 6 per block
  EXPECT_EQ(fwd_fc1, 4);
}

// Buffers are the executor's contract: every one is made and given back once, and the peaks are
// the persistent states plus the largest sum of live buffers, walking the steps in order.
TEST(Schedule, BuffersBalanceAndThePeakIsTheirLargestSum) {
  HardwareProfile p = dgx2();
  for (const std::string& name : preset_names())
    for (int tiling : {1, 2}) {
      TrainingConfig c;
      c.mp = name == "three_d" ? 4 : 1;
      c.tiling_factor = tiling;
      c.dp = 2;
      Placement pl = *preset(name);
      pl.act_ckpt.tier = tiling == 2 ? Tier::cpu : Tier::gpu;
      c.seq = tiny().seq;
      if (pl.layer_major) c.micro_batches = 2;
      Schedule s = *build_schedule(tiny(), pl, c, p);
      std::vector<std::string> bad = check_invariants(s);
      EXPECT_TRUE(bad.empty()) << name << ": " << (bad.empty() ? "" : bad.front());
      for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme}) {
        double persistent = 0;
        for (double b : s.persistent_bytes[int(t)]) persistent += b;
        std::vector<double> live = buffer_bytes_by_step(s, t);
        const double most = live.empty() ? 0 : *std::max_element(live.begin(), live.end());
        EXPECT_NEAR(s.peak_bytes[int(t)], persistent + most, 1e-6 * s.peak_bytes[int(t)]) << name << " " << to_string(t);
      }
    }
}

// Sec. 5.2.2 with three pinned chunk buffers: the reads of chunks 0-2 come first, the read of chunk
// k+3 right after the write that frees its buffer, and CPU memory holds three chunks at most.
TEST(Schedule, OptimizerChunksReadAheadIntoThreeBuffers) {
  HardwareProfile p = dgx2();
  ModelSpec m = tiny();
  p.pinned_budget_bytes = 3 * 20.0 * 100000;  // dp 1: the one rank's, three chunks of 100K parameters
  TrainingConfig c;
  c.dp = 1;
  Schedule s = make(m, "zero_inf_nvme", c, p);
  std::vector<std::string> order;  // r/a/w per optimizer step, states only
  for (const Step& x : s.steps) {
    if (x.phase != Phase::optimizer) continue;
    if (x.kind == StepKind::fetch && x.state == State::optim32) order.push_back("r" + x.name.substr(11));
    if (x.kind == StepKind::optimizer) order.push_back("a" + x.name.substr(11));
    if (x.kind == StepKind::offload && x.state == State::optim32) order.push_back("w" + x.name.substr(11));
  }
  ASSERT_GT(order.size(), 12u);
  const std::vector<std::string> head = {"r0]", "r1]", "r2]", "a0]", "w0]", "r3]", "a1]", "w1]", "r4]"};
  EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + 9), head);
  std::vector<double> cpu = buffer_bytes_by_step(s, Tier::cpu);
  const double chunk_bytes = 20.0 * s.optimizer_chunk_params;  // states 16 B + gradient 2 B + parameter 2 B
  EXPECT_LE(*std::max_element(cpu.begin(), cpu.end()), 3 * chunk_bytes * (1 + 1e-12));
  EXPECT_GE(*std::max_element(cpu.begin(), cpu.end()), 2.5 * chunk_bytes);
  // Chunks tile the partition, at most 100K parameters each, cut inside a unit only at 4096s.
  double at = 0;
  for (const ScheduleChunk& ch : s.optimizer_chunks) {
    EXPECT_DOUBLE_EQ(ch.start, at);
    EXPECT_LE(ch.params, 100000);
    at += ch.params;
  }
  EXPECT_DOUBLE_EQ(at, s.persistent_bytes[int(Tier::nvme)][int(State::optim32)] / 16);
  EXPECT_TRUE(check_invariants(s).empty());
}

// A job on some of a node's GPUs shares its CPU memory, NVMe and pinned budget among those GPUs
// only: `plan --gpus 1` once fitted a whole node's CPU memory that `simulate --plan` then cut to 1/16.
TEST(Schedule, NodeResourcesAreSharedByTheRanksOnTheNode) {
  const HardwareProfile p = dgx2();
  const ModelSpec m = tiny();
  for (int dp : {1, 4, 16}) {
    TrainingConfig c;
    c.dp = dp;
    Schedule s = make(m, "zero_inf_nvme", c, p);
    EXPECT_DOUBLE_EQ(s.capacity_bytes[int(Tier::cpu)], p.cpu_memory_bytes / dp) << dp;
    EXPECT_DOUBLE_EQ(s.capacity_bytes[int(Tier::nvme)], p.nvme_capacity_bytes / dp) << dp;
  }
  HardwareProfile two = p;
  two.nodes = 2;
  TrainingConfig c;
  c.dp = 32;
  EXPECT_DOUBLE_EQ(make(m, "zero_inf_nvme", c, two).capacity_bytes[int(Tier::cpu)], p.cpu_memory_bytes / 16);
}

// An executor's sizes: fp32 parameters double the parameter traffic; a workspace replaces Eq. 5.
TEST(Schedule, MemorySizesScaleWhatIsCounted) {
  HardwareProfile p = dgx2();
  ModelSpec m = tiny();
  TrainingConfig c;
  c.dp = 1;
  c.seq = m.seq;
  Placement pl = *preset("zero_inf_cpu");
  MemorySizes fp32;
  fp32.param_bytes = 4;
  fp32.optim_bytes = 12;
  fp32.optim_grad_bytes = 0;
  fp32.workspace_bytes = 5e6;
  Schedule a = *build_schedule(m, pl, c, p), b = *build_schedule(m, pl, c, p, 0, fp32);
  EXPECT_DOUBLE_EQ(b.traffic_bytes[int(LinkClass::cpu_gpu)], 2 * a.traffic_bytes[int(LinkClass::cpu_gpu)]);
  EXPECT_DOUBLE_EQ(b.persistent_bytes[int(Tier::cpu)][int(State::optim32)],
                   a.persistent_bytes[int(Tier::cpu)][int(State::optim32)] * 12 / 16);
  std::vector<double> gpu = buffer_bytes_by_step(b, Tier::gpu);
  EXPECT_GE(*std::min_element(gpu.begin(), gpu.end()), 5e6);  // held from the first step to the last
  EXPECT_TRUE(check_invariants(b).empty());
}

// --optimizer-overlap backward: a chunk's update waits only for the gradients of its own units, so
// updates are in the list (and can run) before backward ends; dpu: the update runs first, on the
// previous iteration's gradients, each gradient's offload waits for the update that read its slot,
// and the updated parameters reach the GPU after this iteration's last compute.
TEST(Schedule, OptimizerOverlapOptions) {
  HardwareProfile p = dgx2();
  ModelSpec m = tiny();
  auto first_last = [](const Schedule& s, StepKind k, bool cpu_only) {
    int first = -1, last = -1;
    for (const Step& x : s.steps)
      if (x.kind == k && (!cpu_only || x.src == Tier::cpu)) {
        if (first < 0) first = x.id;
        last = x.id;
      }
    return std::pair{first, last};
  };
  for (const char* name : {"zero_inf_cpu", "zero_inf_nvme", "zero_offload"}) {
    TrainingConfig c;
    c.dp = 1;
    c.optimizer_overlap = OptimizerOverlap::backward;
    Schedule s = make(m, name, c, p);
    EXPECT_TRUE(check_invariants(s).empty()) << name << ": " << check_invariants(s).front();
    const auto [first_adam, last_adam] = first_last(s, StepKind::optimizer, true);
    const auto [first_compute, last_compute] = first_last(s, StepKind::compute, false);
    EXPECT_LT(first_adam, last_compute) << name << ": an update before backward ends";
    // no update waits for the last compute unless its chunk holds the embedding (the last gradient)
    int waiting_for_all = 0;
    for (const Step& x : s.steps)
      if (x.kind == StepKind::optimizer)
        for (int d : x.deps) waiting_for_all += d == last_compute;
    EXPECT_LE(waiting_for_all, 1) << name;
    TrainingConfig none = c;
    none.optimizer_overlap = OptimizerOverlap::none;
    Schedule n = make(m, name, none, p);
    for (int l = 0; l < kLinkClasses; ++l) EXPECT_DOUBLE_EQ(s.traffic_bytes[size_t(l)], n.traffic_bytes[size_t(l)]) << name;
  }
  TrainingConfig c;
  c.dp = 2;
  c.optimizer_overlap = OptimizerOverlap::dpu;
  Schedule s = make(m, "zero_offload", c, p);
  EXPECT_TRUE(check_invariants(s).empty()) << check_invariants(s).front();
  const auto [first_adam, last_adam] = first_last(s, StepKind::optimizer, true);
  const auto [first_compute, last_compute] = first_last(s, StepKind::compute, false);
  EXPECT_LT(last_adam, first_compute) << "the delayed update comes first";
  for (const Step& x : s.steps) {
    if (x.kind == StepKind::fetch && x.name == "params" && x.hop == Hop::cg) {
      EXPECT_GT(x.id, last_compute);
      EXPECT_NE(std::find(x.deps.begin(), x.deps.end(), last_compute), x.deps.end()) << "refresh after the computes";
    }
    if (x.kind == StepKind::offload && x.hop == Hop::gc && x.phase == Phase::backward) {
      bool waits = false;
      for (int d : x.deps) waits = waits || s.steps[size_t(d)].kind == StepKind::optimizer;
      EXPECT_TRUE(waits) << "step " << x.id << " overwrites a gradient the update reads";
    }
  }
  // refusals name the flag and the reason
  auto refused = [&](const char* strategy, OptimizerOverlap ov) {
    TrainingConfig t;
    t.optimizer_overlap = ov;
    t.seq = m.seq;
    Result<Schedule> r = build_schedule(m, *preset(strategy), t, p);
    return r.ok() ? std::string("(accepted)") : r.error();
  };
  EXPECT_NE(refused("zero3", OptimizerOverlap::backward).find("--optimizer-overlap backward: needs the optimizer states off the GPU"), std::string::npos);
  EXPECT_NE(refused("zero_inf_cpu", OptimizerOverlap::dpu).find("param16 on gpu"), std::string::npos);
  EXPECT_NE(refused("l2l", OptimizerOverlap::backward).find("l2l"), std::string::npos);
}

// Sec. 5.2.2's pipeline needs several chunks to overlap reading, updating and writing: at least 16
// by default when the pinned budget allows, or as many as asked.
TEST(Schedule, OptimizerChunksPipeline) {
  HardwareProfile p = dgx2();
  ModelSpec m = tiny();
  TrainingConfig c;
  c.dp = 1;
  Schedule s = make(m, "zero_inf_nvme", c, p);
  EXPECT_GE(s.optimizer_chunks.size(), 16u);
  c.optimizer_chunks = 4;
  Schedule four = make(m, "zero_inf_nvme", c, p);
  EXPECT_GE(four.optimizer_chunks.size(), 4u);
  EXPECT_LE(four.optimizer_chunks.size(), 5u);  // cut at unit boundaries and 4096-parameter granules
  EXPECT_TRUE(check_invariants(four).empty());
}

TEST(Placement, MeaninglessPlacementsAreRejectedWithAReason) {
  Placement p = *preset("zero2");
  p.grad16.tier = Tier::nvme;
  p.optim32.tier = Tier::nvme;
  Result<Placement> r = validate(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("grad16 on nvme with param16 unpartitioned"), std::string::npos) << r.error();
  p = *preset("zero3");
  p.act_ckpt.tier = Tier::nvme;
  EXPECT_FALSE(validate(p).ok());
  p = *preset("zero_inf_cpu");
  p.grad16.partitioned = false;  // partitioned parameters need partitioned gradients
  EXPECT_FALSE(validate(p).ok());
  EXPECT_FALSE(load_placement("zero9").ok());
  EXPECT_TRUE(load_placement("zero3", {"act_ckpt=cpu"}).ok());
  EXPECT_FALSE(load_placement("zero3", {"grad16=disk"}).ok());
  for (const auto& name : preset_names()) EXPECT_TRUE(validate(*preset(name)).ok()) << name;
}

TEST(Placement, FromYaml) {
  Result<Placement> p = parse_placement("preset: zero3\noptim32: {tier: cpu, partitioned: true}\n", "p.yaml");
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->optim32.tier, Tier::cpu);
  Result<Placement> bad = parse_placement("preset: zero3\ngrad16: {tier: cpu, partitioned: true}\n", "p.yaml");
  ASSERT_FALSE(bad.ok());  // gradients on cpu while optimizer states stay on gpu
  EXPECT_NE(bad.error().find("p.yaml"), std::string::npos);
  bad = parse_placement("preset: zero3\noptim32: {tier: tape}\n", "p.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("p.yaml:2: optim32.tier"), std::string::npos) << bad.error();
}

// A golden dump: any change to the schedule shows up in review. Regenerate with
// MEMWALL_UPDATE_GOLDEN=1 ctest -R Golden, then read the diff.
TEST(Golden, TinyZeroInfNvme) {
  HardwareProfile p = dgx2();
  TrainingConfig c;
  c.dp = 2;
  Schedule s = make(tiny(), "zero_inf_nvme", c, p);
  const std::string path = MEMWALL_SOURCE_DIR "/tests/model/golden/schedule_tiny_zero_inf_nvme.txt";
  const std::string text = schedule_text(s);
  if (std::getenv("MEMWALL_UPDATE_GOLDEN")) std::ofstream(path) << text;
  std::ifstream in(path);
  std::stringstream golden;
  golden << in.rdbuf();
  EXPECT_EQ(text, golden.str()) << "schedule changed; if intended, regenerate " << path;
}

}  // namespace
}  // namespace memwall

namespace memwall {
namespace {

// Issue 30, item 6: a schedule is linear in layers, in steps, dependencies and buffers. Each
// optimizer read once waited for every gradient offload (layers x chunks dependencies), and the
// memory plan's packing and reuse checks were quadratic: 8000 layers took 490 s. Doubling the
// layers must at most double (plus a constant's slack) each count, and the arena stays within 2 %
// of the live peak past the greedy packer's size (first fit in time order: 1000 layers here).
TEST(ScheduleScale, DependenciesAndBuffersGrowLinearlyInLayers) {
  HardwareProfile p = dgx2();
  p.pinned_budget_bytes = 256 << 20;  // optimizer chunks of a fixed size: their number grows with the layers
  auto counts = [&](int layers, bool check_arena) {
    TrainingConfig c;
    c.bsz = 1;
    c.optimizer_overlap = OptimizerOverlap::none;  // the chunks after backward (run_chunks)
    Placement pl = *preset("zero_inf_nvme");
    pl.act_ckpt.tier = Tier::cpu;
    ModelSpec m = *model_from_shape(layers, 1024, 16, 1024, 50304);
    c.seq = m.seq;
    Result<Schedule> s = build_schedule(m, pl, c, p, 0);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error());
    std::size_t deps = 0, most = 0;
    for (const Step& st : s->steps) {
      deps += st.deps.size();
      most = std::max(most, st.deps.size());
    }
    for (Tier t : {Tier::gpu, Tier::cpu})
      if (check_arena) {  // the greedy packer (fewer buffers) spreads up to twice the peak by design
        EXPECT_LE(double(s->arena_bytes[int(t)]), 1.02 * s->peak_bytes[int(t)] + (64 << 20))
          << layers << " layers, " << to_string(t);
      }
    return std::array<double, 4>{double(s->steps.size()), double(deps), double(s->buffers.size()), double(most)};
  };
  const auto small = counts(500, false), large = counts(1000, true);
  for (int i = 0; i < 3; ++i) EXPECT_LE(large[size_t(i)], 2.05 * small[size_t(i)]) << "count " << i;
  // the most dependencies of one step grow at most linearly too (an optimizer chunk's fetch
  // waits on the bytes it reuses, not on every gradient)
  EXPECT_LE(large[3], 2.05 * small[3]);
}

}  // namespace
}  // namespace memwall
