// Gradient accumulation in the schedule: TrainingConfig::grad_accum forward/backward micro-steps,
// then one optimizer step. Against the same schedule without accumulation: the work of a micro-step
// repeats, the optimizer does not, whole-gradient all-reduces happen once, and the memory peaks do
// not grow after the second micro-step (what the planner's memory check relies on).
#include <gtest/gtest.h>

#include "model/schedule.hpp"

namespace memwall {
namespace {

const char* const kPresets[] = {"data_parallel", "zero2",         "zero_offload", "zero3",
                                "zero_inf_cpu",  "zero_inf_nvme", "three_d",      "l2l"};

Schedule make(const std::string& strategy, int grad_accum, OptimizerOverlap ov = OptimizerOverlap::none) {
  const ModelSpec m = *model_from_shape(3, 256, 4, 64, 512);
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 2;
  c.grad_accum = grad_accum;
  c.optimizer_overlap = ov;
  if (strategy == "three_d") c.mp = 2;
  if (strategy == "l2l") c.micro_batches = 2;
  Result<Schedule> s = build_schedule(m, *preset(strategy), c, *load_profile("dgx2"));
  EXPECT_TRUE(s.ok()) << strategy << ": " << (s.ok() ? "" : s.error());
  return s.ok() ? *s : Schedule{};
}

double bytes_of(const Schedule& s, StepKind k, std::optional<State> st = std::nullopt) {
  double b = 0;
  for (const Step& x : s.steps)
    if (x.kind == k && (!st || x.state == st)) b += x.bytes;
  return b;
}
double params_updated(const Schedule& s) {
  double n = 0;
  for (const Step& x : s.steps) n += x.params;
  return n;
}

TEST(GradAccum, MicroStepsRepeatTheWorkAndTheOptimizerRunsOnce) {
  for (const char* name : kPresets) {
    SCOPED_TRACE(name);
    const Schedule one = make(name, 1), three = make(name, 3);
    EXPECT_EQ(three.grad_accum, 3);
    EXPECT_TRUE(check_invariants(three).empty()) << check_invariants(three).front();
    EXPECT_NEAR(three.compute_flops, 3 * one.compute_flops, 1e-9 * one.compute_flops);
    EXPECT_DOUBLE_EQ(params_updated(three), params_updated(one));
    // checkpoints are saved and loaded in every micro-step
    EXPECT_NEAR(bytes_of(three, StepKind::save_ckpt), 3 * bytes_of(one, StepKind::save_ckpt), 1e-6);
    EXPECT_NEAR(bytes_of(three, StepKind::load_ckpt), 3 * bytes_of(one, StepKind::load_ckpt), 1e-6);
    // partitioned gradients are reduce-scattered in every micro-step (each rank keeps only its part)
    EXPECT_NEAR(bytes_of(three, StepKind::reduce_scatter), 3 * bytes_of(one, StepKind::reduce_scatter), 1e-6);
    // whole gradients accumulate on each GPU and are all-reduced once; ones that leave the GPU
    // (l2l's, in CPU memory) are all-reduced in every micro-step before they are added there
    const Placement pl = *preset(name);
    const double reduced = pl.grad16.tier == Tier::gpu ? 1 : 3;
    EXPECT_NEAR(bytes_of(three, StepKind::allreduce, State::grad16),
                reduced * bytes_of(one, StepKind::allreduce, State::grad16), 1e-6);
    int labelled[3] = {0, 0, 0};
    for (const Step& st : three.steps) {
      if (st.phase == Phase::optimizer) {
        EXPECT_EQ(st.accum_step, -1) << st.id;
      } else {
        ASSERT_GE(st.accum_step, 0) << st.id;
        ASSERT_LT(st.accum_step, 3) << st.id;
        if (st.kind == StepKind::compute) ++labelled[st.accum_step];
      }
    }
    EXPECT_EQ(labelled[0], labelled[1]);
    EXPECT_EQ(labelled[1], labelled[2]);
    for (const Step& st : one.steps) EXPECT_EQ(st.accum_step, -1);
  }
}

TEST(GradAccum, FetchesRepeatPerMicroStep) {
  for (const char* name : {"zero3", "zero_inf_cpu", "zero_inf_nvme"}) {
    SCOPED_TRACE(name);
    const Schedule one = make(name, 1), four = make(name, 4);
    const double f1 = bytes_of(one, StepKind::fetch, State::param16), f4 = bytes_of(four, StepKind::fetch, State::param16);
    // the refresh of updated parameters (optimizer phase) happens once; the rest four times
    double refresh = 0;
    for (const Step& st : one.steps)
      if (st.kind == StepKind::fetch && st.state == State::param16 && st.phase == Phase::optimizer) refresh += st.bytes;
    EXPECT_NEAR(f4 - refresh, 4 * (f1 - refresh), 1e-6 * f1);
  }
}

// The planner checks memory on two micro-steps (planner/recommend.cpp): every later one must
// repeat the second's peaks exactly.
TEST(GradAccum, PeaksStopGrowingAfterTheSecondMicroStep) {
  for (const char* name : kPresets) {
    SCOPED_TRACE(name);
    const Schedule one = make(name, 1), two = make(name, 2), five = make(name, 5);
    for (int t = 0; t < kTiers; ++t) {
      EXPECT_DOUBLE_EQ(five.peak_bytes[size_t(t)], two.peak_bytes[size_t(t)]) << "tier " << t;
      EXPECT_GE(two.peak_bytes[size_t(t)], one.peak_bytes[size_t(t)]) << "tier " << t;
    }
  }
  for (OptimizerOverlap ov : {OptimizerOverlap::backward, OptimizerOverlap::dpu}) {
    const Schedule two = make("zero_offload", 2, ov), five = make("zero_offload", 5, ov);
    EXPECT_TRUE(check_invariants(five).empty()) << check_invariants(five).front();
    for (int t = 0; t < kTiers; ++t) EXPECT_DOUBLE_EQ(five.peak_bytes[size_t(t)], two.peak_bytes[size_t(t)]);
  }
}

// With the optimizer overlapped with backward, a chunk may start only once its gradients are
// final: in the last micro-step, never during an earlier one.
TEST(GradAccum, OverlappedUpdatesWaitForTheLastMicroStep) {
  const Schedule s = make("zero_inf_cpu", 3, OptimizerOverlap::backward);
  ASSERT_TRUE(check_invariants(s).empty()) << check_invariants(s).front();
  int first_of_last = -1;
  for (const Step& st : s.steps)
    if (st.accum_step == 2 && first_of_last < 0) first_of_last = st.id;
  ASSERT_GT(first_of_last, 0);
  int updates = 0;
  for (const Step& st : s.steps)
    if (st.kind == StepKind::optimizer) {
      ++updates;
      EXPECT_GT(st.id, first_of_last) << "update at step " << st.id << " before the last micro-step";
      bool waits = false;
      for (int d : st.deps) waits = waits || s.steps[size_t(d)].accum_step == 2;
      EXPECT_TRUE(waits) << "update at step " << st.id << " waits for no gradient of the last micro-step";
    }
  EXPECT_GT(updates, 0);
}

TEST(GradAccum, OutOfRangeNamesTheFlag) {
  TrainingConfig c;
  c.grad_accum = 0;
  Result<TrainingConfig> r = validate_ranges(c, 4);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--grad-accum"), std::string::npos) << r.error();
  c.grad_accum = kMaxGradAccum + 1;
  EXPECT_FALSE(validate_ranges(c, 4).ok());
  // a schedule too large for this machine blames the accumulation it was given
  c.grad_accum = kMaxGradAccum;
  Result<TrainingConfig> big = schedule_size_check(c, 96, 1e9);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().rfind("--grad-accum", 0), 0u) << big.error();
}

TEST(GradAccum, GlobalBatchIsMicroBatchTimesStepsTimesRanks) {
  TrainingConfig c;
  c.bsz = 4;
  c.grad_accum = 8;
  c.dp = 16;
  EXPECT_DOUBLE_EQ(global_batch(c), 512);
}

}  // namespace
}  // namespace memwall
