// The learning-rate schedule (issue 26, item 5): Megatron-LM's warm-up and decay styles, checked at
// the points their definitions fix (warm-up linear from lr/W, the decay's start at lr, a cosine's
// and a line's midpoint at the mean of lr and min_lr, the floor from decay_steps on), and CpuAdam
// taking a step's rate: the same bits as an Adam made with that rate.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "exec/adam/cpu_adam.hpp"
#include "exec/adam/lr_schedule.hpp"

namespace memwall::adam {
namespace {

TEST(LrSchedule, WarmUpThenDecayToTheFloor) {
  const double lr = 3e-3, floor = 3e-4;
  for (LrDecay d : {LrDecay::linear, LrDecay::cosine}) {
    SCOPED_TRACE(to_string(d));
    const LrSchedule s{d, 10, 110, floor};
    EXPECT_DOUBLE_EQ(lr_at(s, lr, 1), lr / 10);
    EXPECT_DOUBLE_EQ(lr_at(s, lr, 5), lr / 2);
    EXPECT_DOUBLE_EQ(lr_at(s, lr, 10), lr);
    EXPECT_DOUBLE_EQ(lr_at(s, lr, 60), (lr + floor) / 2);  // half-way through the decay
    EXPECT_DOUBLE_EQ(lr_at(s, lr, 110), floor);
    EXPECT_DOUBLE_EQ(lr_at(s, lr, 1000), floor);
    for (long k = 11; k <= 110; ++k) EXPECT_LE(lr_at(s, lr, k), lr_at(s, lr, k - 1)) << k;
  }
  // a quarter of the way: the line at 3/4 of the span, the cosine at (1 + cos(pi / 4)) / 2 of it
  EXPECT_DOUBLE_EQ(lr_at({LrDecay::linear, 0, 100, 0}, 1.0, 25), 0.75);
  EXPECT_NEAR(lr_at({LrDecay::cosine, 0, 100, 0}, 1.0, 25), (1 + std::sqrt(0.5)) / 2, 1e-15);
  // constant: the warm-up, then the peak for ever
  EXPECT_DOUBLE_EQ(lr_at({LrDecay::constant, 4, 0, 0}, lr, 2), lr / 2);
  EXPECT_DOUBLE_EQ(lr_at({LrDecay::constant, 4, 0, 0}, lr, 5000), lr);
  EXPECT_DOUBLE_EQ(lr_at({}, lr, 1), lr);
}

TEST(LrSchedule, NamesParseAndBadOnesAreRefused) {
  for (LrDecay d : {LrDecay::constant, LrDecay::linear, LrDecay::cosine}) EXPECT_EQ(*parse_lr_decay(to_string(d)), d);
  Result<LrDecay> bad = parse_lr_decay("exponential");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), "expected constant, linear or cosine, got \"exponential\"");
  EXPECT_EQ(describe({LrDecay::cosine, 30, 300, 1e-5}), "cosine to 1e-05 at step 300, 30 warm-up steps");
}

TEST(LrSchedule, CpuAdamTakesTheStepsRate) {
  const std::size_t n = 1000;
  std::vector<float> grad(n);
  for (std::size_t i = 0; i < n; ++i) grad[i] = std::sin(0.37 * double(i)) * 1e-2f;
  auto run = [&](double made_with, std::optional<double> given) {
    AdamOptions o;
    o.lr = made_with;
    CpuAdam a = CpuAdam::create(o, 1).value();
    std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
    AdamChunk c{p.data(), m.data(), v.data(), grad.data(), DType::fp32, nullptr, DType::bf16, n};
    for (long step = 1; step <= 3; ++step) EXPECT_TRUE(a.step(c, step, {}, given).ok());
    return p;
  };
  EXPECT_EQ(run(1e-3, 2.5e-4), run(2.5e-4, std::nullopt));
  EXPECT_NE(run(1e-3, 2.5e-4), run(1e-3, std::nullopt));
  AdamOptions o;
  CpuAdam a = CpuAdam::create(o, 1).value();
  float x = 0, y = 0, z = 0;
  EXPECT_FALSE(a.step({&x, &y, &z, &x, DType::fp32, nullptr, DType::bf16, 1}, 1, {}, -1.0).ok());
}

}  // namespace
}  // namespace memwall::adam
