// Seed 004's what-ifs in the planner's fit and time: Eq. 5 at the attention density, 1-bit Adam's
// error feedback beside optim32 and its 1/16 data-parallel gradient traffic. Closed forms, 1e-12.
#include <gtest/gtest.h>

#include "model/analysis.hpp"
#include "planner/fit.hpp"
#include "planner_test_util.hpp"

namespace memwall::planner {
namespace {

using testing::check_of;
using testing::make_candidate;

// The part whose words start with `what`.
double part(const LimitCheck& c, const std::string& what) {
  for (const Part& p : c.parts)
    if (p.what.rfind(what, 0) == 0) return p.bytes;
  ADD_FAILURE() << "no part " << what << " in " << c.sentence();
  return 0;
}

TEST(WhatIfFit, AwmIsEq5AtTheAttentionDensity) {
  const ModelSpec m = *load_model("table1-10B");
  const HardwareProfile p = *load_profile("dgx2");
  Candidate c = make_candidate("zero3", 1, 1, 1, 16);
  c.config.seq = 16384;
  c.config.what_if.attention_density = 0.1;
  const FitReport f = check_fit(m, c, p);
  EXPECT_NEAR(part(check_of(f, Resource::gpu_memory), "AWM (Eq. 5)") /
                  awm_bytes_eq5(1, 16384, 1, m.hidden, m.heads, 0.1), 1.0, 1e-12);
}

TEST(WhatIfFit, OnebitErrorFeedbackIsFourBytesPerParameterBesideOptim32) {
  const ModelSpec m = *load_model("table1-10B");
  const HardwareProfile p = *load_profile("dgx2");
  Candidate c = make_candidate("zero_inf_cpu", 1, 1, 1, 16);
  c.config.what_if.onebit_adam = true;
  const FitReport f = check_fit(m, c, p);
  c.config.what_if.onebit_adam = false;
  const FitReport plain = check_fit(m, c, p);
  // optim32's 16 B per parameter of the shard, and 4 B more of error feedback beside it
  EXPECT_NEAR(part(check_of(f, Resource::cpu_memory), "optim32 (1/dp shard) with 1-bit Adam's error feedback") /
                  part(check_of(plain, Resource::cpu_memory), "optim32 (1/dp shard)"), 20.0 / 16.0, 1e-12);
}

TEST(WhatIfTime, OnebitSendsASixteenthOfTheGradients) {
  const ModelSpec m = *load_model("table1-10B");
  const HardwareProfile p = *scale_to_nodes(*load_profile("dgx2"), 4);
  Candidate c = make_candidate("zero3", 2, 1, 1, 64);
  Candidate ob = c;
  ob.config.what_if.onebit_adam = true;
  const TimeBreakdown a = estimate_time(m, c, p), b = estimate_time(m, ob, p);
  // zero3: 3/4 of Eq. 9's bytes are parameter all-gathers (unchanged), 1/4 gradient reduce-scatters;
  // the collectives' step latencies are the same whatever their bytes
  EXPECT_GT(a.collective_latency_s, 0);
  EXPECT_EQ(a.collective_latency_s, b.collective_latency_s);
  const double bytes_s = a.param_grad_s - a.collective_latency_s;
  EXPECT_NEAR((a.param_grad_s - b.param_grad_s) / (bytes_s * 0.25 * 15.0 / 16.0), 1.0, 1e-12);
  EXPECT_LE(b.iteration_s, a.iteration_s);
}

}  // namespace
}  // namespace memwall::planner
