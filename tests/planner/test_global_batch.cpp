// `memwall plan --global-batch N` (issue 17): every candidate trains N samples per optimizer step,
// bsz x gradient accumulation x dp, with dp free to be fewer than all GPUs; the analytic time
// repeats a micro-step's work per accumulation step and the optimizer once; plan files carry it.
#include <gtest/gtest.h>

#include "planner/plan_file.hpp"
#include "planner/search.hpp"

namespace memwall::planner {
namespace {

TEST(GlobalBatch, SplitTakesTheMostRanksThatDivide) {
  using P = std::pair<int, int>;
  EXPECT_EQ(split_global_batch(512, 4, 16), P(16, 8));
  EXPECT_EQ(split_global_batch(8, 1, 16), P(8, 1));      // fewer ranks than GPUs, no accumulation
  EXPECT_EQ(split_global_batch(96, 1, 64), P(48, 2));    // 64 does not divide 96: 48 ranks
  EXPECT_EQ(split_global_batch(13, 1, 8), P(1, 13));     // a prime: one rank accumulates
  EXPECT_EQ(split_global_batch(7, 2, 16), std::nullopt);  // bsz must divide N
  EXPECT_EQ(split_global_batch(8, 1.5, 16), std::nullopt);
  EXPECT_EQ(split_global_batch(long(kMaxGradAccum) * 2, 1, 1), std::nullopt);
}

TEST(GlobalBatch, EveryCandidateTrainsTheGlobalBatch) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *load_model("table1-10B");
  for (long n : {8L, 96L, 1024L}) {
    SCOPED_TRACE(n);
    SearchSpace space = *make_space(m, p, {});
    space.global_batch = n;
    const SearchResult r = search(m, p, space);
    ASSERT_TRUE(r.fits());
    for (const auto* list : {&r.ranked, &r.top})
      for (const Evaluated& e : *list) {
        const TrainingConfig& c = e.candidate.config;
        EXPECT_DOUBLE_EQ(global_batch(c), double(n));
        EXPECT_LE(long(c.dp) * c.mp, p.total_gpus());
        EXPECT_NEAR(e.time.samples_per_s, double(n) / e.time.iteration_s, 1e-9 * e.time.samples_per_s);
        // the split is the largest dp that divides: no larger one would have trained the same batch
        const auto split = split_global_batch(n, c.bsz, p.total_gpus() / c.mp);
        ASSERT_TRUE(split.has_value());
        EXPECT_EQ(split->first, c.dp);
        EXPECT_EQ(split->second, c.grad_accum);
      }
    if (n == 8) {  // 8 samples on 16 GPUs: at most 8 ranks (x mp) train
      for (const Evaluated& e : r.ranked) EXPECT_LE(e.candidate.config.dp, 8);
    }
    if (n == 1024) {  // 16 ranks of at most 32 samples: accumulation makes up the rest
      bool accumulates = false;
      for (const Evaluated& e : r.ranked) accumulates = accumulates || e.candidate.config.grad_accum > 1;
      EXPECT_TRUE(accumulates);
    }
  }
}

TEST(GlobalBatch, UnconstrainedKeepsEveryGpuAndNoAccumulation) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *load_model("table1-10B");
  const SearchResult r = search(m, p, *make_space(m, p, {}));
  ASSERT_TRUE(r.fits());
  for (const Evaluated& e : r.top) {
    EXPECT_EQ(e.candidate.config.grad_accum, 1);
    EXPECT_EQ(e.candidate.config.dp * e.candidate.config.mp, p.total_gpus());
  }
}

// Accumulation repeats a micro-step (compute and its traffic) and not the optimizer: the analytic
// time is linear in the steps, with the optimizer as its intercept.
TEST(GlobalBatch, AnalyticTimeRepeatsTheMicroStepNotTheOptimizer) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *load_model("table1-10B");
  for (const char* name : {"zero_offload", "zero_inf_cpu", "zero_inf_nvme", "data_parallel"}) {
    SCOPED_TRACE(name);
    Candidate c{*preset(name), {}};
    c.config.seq = m.seq;
    c.config.bsz = 2;
    c.config.dp = 16;
    TimeBreakdown t[4];
    for (int k = 1; k <= 3; ++k) {
      c.config.grad_accum = k;
      t[k] = estimate_time(m, c, p);
      EXPECT_NEAR(t[k].compute_s, k * t[1].compute_s, 1e-12 * t[k].compute_s);
      EXPECT_NEAR(t[k].tflops_per_gpu * t[k].iteration_s, k * t[1].tflops_per_gpu * t[1].iteration_s,
                  1e-9 * t[k].tflops_per_gpu * t[k].iteration_s);
    }
    const double step = t[2].iteration_s - t[1].iteration_s;
    EXPECT_NEAR(t[3].iteration_s - t[2].iteration_s, step, 1e-9 * step);
    EXPECT_DOUBLE_EQ(t[3].optimizer_s, t[1].optimizer_s);
    // the intercept is what runs once per optimizer step
    EXPECT_NEAR(t[1].iteration_s - step, std::max(t[1].optimizer_s, t[1].refresh_s),
                1e-6 * t[1].iteration_s + (std::string(name) == "data_parallel" ? 0.2 * t[1].iteration_s : 0));
    // more samples per optimizer step: more of them per second, where the optimizer costs time
    if (t[1].optimizer_s > 0) EXPECT_GT(t[3].samples_per_s, t[1].samples_per_s);
    else EXPECT_NEAR(t[3].samples_per_s, t[1].samples_per_s, 1e-9 * t[1].samples_per_s);
  }
}

TEST(GlobalBatch, PlanFileCarriesItAndChecksTheProduct) {
  Plan a;
  a.profile = "dgx2";
  a.model = *load_model("table1-10B");
  a.candidate.placement = *preset("zero_inf_cpu");
  a.candidate.placement.name = "zero_inf_cpu";
  TrainingConfig& c = a.candidate.config;
  c.seq = a.model.seq;
  c.bsz = 4;
  c.ci = 2;
  c.dp = 8;
  c.grad_accum = 16;
  a.gpus = 8;
  a.global_batch = 512;
  const HardwareProfile p = *load_profile("dgx2");
  const std::string yaml = plan_yaml(a);
  Result<Plan> b = parse_plan(yaml, "plan.yaml", &p);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->candidate.config.grad_accum, 16);
  ASSERT_TRUE(b->global_batch.has_value());
  EXPECT_EQ(*b->global_batch, 512);
  // a hand edit that breaks the product is refused at its line
  std::string bad = yaml;
  bad.replace(bad.find("grad_accum: 16"), 14, "grad_accum: 8");
  Result<Plan> e = parse_plan(bad, "plan.yaml", &p);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("training.global_batch: expected bsz x grad_accum x dp = 4 x 8 x 8 = 256, got 512"),
            std::string::npos)
      << e.error();
  EXPECT_EQ(e.error().rfind("plan.yaml:", 0), 0u) << e.error();
  // plans written before: no grad_accum means 1, no global_batch means unconstrained
  std::string old = yaml;
  old.erase(old.find("  grad_accum:"), old.find('\n', old.find("  grad_accum:")) + 1 - old.find("  grad_accum:"));
  old.erase(old.find("  global_batch:"), old.find('\n', old.find("  global_batch:")) + 1 - old.find("  global_batch:"));
  Result<Plan> o = parse_plan(old, "plan.yaml", &p);
  ASSERT_TRUE(o.ok()) << o.error();
  EXPECT_EQ(o->candidate.config.grad_accum, 1);
  EXPECT_FALSE(o->global_batch.has_value());
}

}  // namespace
}  // namespace memwall::planner
