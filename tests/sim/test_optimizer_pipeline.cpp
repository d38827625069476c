// The optimizer's own pipeline (Sec. 5.2.2, issue 18): with the states on NVMe, chunk k + 1 is read
// while chunk k is updated and chunk k - 1 written. The stage times R (NVMe reads), U (CPU Adam)
// and W (NVMe writes) are measured, not assumed: a replay with overlap off runs every step alone,
// and its trace gives each optimizer step's own duration. The overlapped replay of the same
// schedule must then take about the slowest stage plus one chunk through the others. Reads and
// writes share the drives (sim/platform.cpp: one link of max(read, write) bandwidth under both, as
// an SSD under mixed load), so the stages are NVMe (R + W) and CPU (U):
// max(R + W, U) + (R + U + W) / chunks.
// One chunk is serial again (U + W at least: its reads may start during backward).
#include <gtest/gtest.h>

#include "model/analysis.hpp"
#include "sim/replay.hpp"

namespace memwall::sim {
namespace {

struct Stages {
  double read_s = 0, update_s = 0, write_s = 0;
  double slowest() const { return std::max(read_s + write_s, update_s); }  // NVMe or CPU
  double sum() const { return read_s + update_s + write_s; }
};

struct Case {
  ModelSpec model = *model_from_shape(4, 4096, 32, 1024, 1000);
  Placement placement;
  HardwareProfile profile = *load_profile("dgx2");
  TrainingConfig config;
  explicit Case(int chunks) {
    placement = *preset("zero_inf_nvme");
    config.dp = 1;
    config.seq = model.seq;
    config.optimizer_chunks = chunks;
    // one chunk of the whole partition needs three buffers of it in pinned memory
    if (chunks == 1) profile.pinned_budget_bytes = profile.cpu_memory_bytes;
  }
};

// The optimizer steps' own durations, from a replay where nothing overlaps.
Stages measure(const Case& s, const Schedule& sched) {
  SimOptions o;
  o.overlap = false;
  o.trace = true;
  Result<SimReport> r = simulate_isolated(s.model, s.placement, s.config, s.profile, o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error());
  Stages st;
  if (!r.ok()) return st;
  for (const TraceEvent& e : r->trace) {
    const Step& step = sched.steps.at(e.step);
    if (step.phase != Phase::optimizer) continue;
    const double d = e.end_s - e.start_s;
    if (step.kind == StepKind::optimizer) st.update_s += d;
    else if (step.link == LinkClass::nvme_cpu) (step.src == Tier::nvme ? st.read_s : st.write_s) += d;
  }
  return st;
}

double optimizer_phase_s(const Case& s) {
  SimOptions o;
  Result<SimReport> r = simulate_isolated(s.model, s.placement, s.config, s.profile, o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error());
  if (!r.ok()) return 0;
  EXPECT_FALSE(r->overflow);
  return r->phase_end_s.at("optim") - r->phase_end_s.at("bwd");
}

TEST(OptimizerPipeline, ApproachesTheSlowestStagePlusOneChunk) {
  Case s(0);  // automatic: at least 16 chunks within the pinned budget
  Result<Schedule> sched = build_schedule(s.model, s.placement, s.config, s.profile);
  ASSERT_TRUE(sched.ok()) << sched.error();
  const int chunks = int(sched->optimizer_chunks.size());
  ASSERT_GE(chunks, 16);
  const Stages st = measure(s, *sched);
  ASSERT_GT(st.read_s, 0);
  ASSERT_GT(st.update_s, 0);
  ASSERT_GT(st.write_s, 0);
  const double phase = optimizer_phase_s(s);
  const double bound = st.slowest() + st.sum() / chunks;
  EXPECT_LE(phase, 1.05 * bound) << "R " << st.read_s << " U " << st.update_s << " W " << st.write_s << ", "
                                 << chunks << " chunks";
  EXPECT_GE(phase, 0.95 * std::max(st.update_s, st.write_s));
  EXPECT_LT(phase, 0.8 * st.sum());  // the pipeline did overlap the stages
}

TEST(OptimizerPipeline, OneChunkIsSerial) {
  Case s(1);
  Result<Schedule> sched = build_schedule(s.model, s.placement, s.config, s.profile);
  ASSERT_TRUE(sched.ok()) << sched.error();
  ASSERT_EQ(sched->optimizer_chunks.size(), 1u);
  const Stages st = measure(s, *sched);
  const double phase = optimizer_phase_s(s);
  EXPECT_GE(phase, 0.95 * (st.update_s + st.write_s));
  EXPECT_LE(phase, 1.05 * st.sum());
}

}  // namespace
}  // namespace memwall::sim
