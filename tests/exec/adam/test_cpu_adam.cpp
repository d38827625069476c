// CpuAdam without torch: every ISA path this CPU runs against the scalar path (bit for bit), the
// threaded split against one thread, chunked updates against a whole-tensor update, known
// conversions, and input validation. The comparison with torch is torch_reference.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <fstream>

#include <gtest/gtest.h>

#include "exec/adam/adam_bench.hpp"
#include "exec/adam/cpu_adam.hpp"

namespace memwall::adam {
namespace {

struct State {
  std::vector<float> param, m, v;
  std::vector<std::vector<std::uint16_t>> grads16;  // per step, fp16 or bf16 bits
  std::vector<std::vector<float>> grads32;          // per step
  std::vector<std::uint16_t> p16;
};

State make_state(std::size_t n, int steps, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  State s;
  for (std::size_t i = 0; i < n; ++i) {
    s.param.push_back(normal(rng));
    s.m.push_back(0);
    s.v.push_back(0);
  }
  for (int k = 0; k < steps; ++k) {
    std::vector<float> g32;
    std::vector<std::uint16_t> g16;
    for (std::size_t i = 0; i < n; ++i) {
      g32.push_back(normal(rng) * 100.0f);
      g16.push_back(static_cast<std::uint16_t>(rng()));
    }
    // Keep the 16-bit gradients finite in both formats: clear the top exponent bit.
    for (auto& h : g16) h &= 0xBFFF;
    s.grads32.push_back(std::move(g32));
    s.grads16.push_back(std::move(g16));
  }
  s.p16.assign(n, 0xDEAD);
  return s;
}

void run_steps(CpuAdam& adam, State& s, DType grad, DType copy, std::size_t begin, std::size_t end) {
  for (std::size_t k = 0; k < s.grads32.size(); ++k) {
    AdamChunk c;
    c.param = s.param.data() + begin;
    c.exp_avg = s.m.data() + begin;
    c.exp_avg_sq = s.v.data() + begin;
    c.grad = grad == DType::fp32 ? static_cast<const void*>(s.grads32[k].data() + begin)
                                 : static_cast<const void*>(s.grads16[k].data() + begin);
    c.grad_dtype = grad;
    c.param16 = s.p16.data() + begin;
    c.param16_dtype = copy;
    c.n = end - begin;
    Result<std::size_t> r = adam.step(c, static_cast<long>(k) + 1, GradScaling{512.0, 0.75});
    ASSERT_TRUE(r.ok()) << r.error();
    EXPECT_EQ(*r, end - begin);
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

AdamOptions options(bool decoupled) {
  AdamOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.05;
  o.decoupled_weight_decay = decoupled;
  return o;
}

TEST(CpuAdam, EveryIsaMatchesScalarBitForBit) {
  const std::size_t sizes[] = {1, 7, 15, 16, 17, 31, 33, 100, 1000, 70001};
  for (Isa isa : supported_isas()) {
    for (bool decoupled : {false, true}) {
      for (DType grad : {DType::fp32, DType::fp16, DType::bf16}) {
        for (DType copy : {DType::bf16, DType::fp16}) {
          for (std::size_t n : sizes) {
            SCOPED_TRACE(std::string(isa_name(isa)) + " decoupled=" + std::to_string(decoupled) + " grad=" +
                         std::string(dtype_name(grad)) + " copy=" + std::string(dtype_name(copy)) +
                         " n=" + std::to_string(n));
            State ref = make_state(n, 3, static_cast<unsigned>(n));
            State got = ref;
            CpuAdam scalar = CpuAdam::create(options(decoupled), 1, Isa::scalar).value();
            CpuAdam simd = CpuAdam::create(options(decoupled), 3, isa).value();
            ASSERT_EQ(simd.isa(), isa);
            run_steps(scalar, ref, grad, copy, 0, n);
            run_steps(simd, got, grad, copy, 0, n);
            EXPECT_TRUE(same_bits(ref.param, got.param));
            EXPECT_TRUE(same_bits(ref.m, got.m));
            EXPECT_TRUE(same_bits(ref.v, got.v));
            EXPECT_EQ(ref.p16, got.p16);
          }
        }
      }
    }
  }
}

// Ranges of more than 1 Mi elements per thread stream the copy with non-temporal stores after
// peeling elements up to an aligned address; shift the copy by 1..3 elements to move that peel.
TEST(CpuAdam, LargeChunksWithStreamedCopyMatchScalar) {
  const std::size_t n = 2 * (std::size_t{1} << 20) + 4099;
  for (std::size_t shift : {1, 3}) {
    State ref = make_state(n, 1, 11);
    CpuAdam scalar = CpuAdam::create(options(false), 2, Isa::scalar).value();
    run_steps(scalar, ref, DType::fp16, DType::bf16, 0, n);
    for (Isa isa : supported_isas()) {
      for (DType copy : {DType::bf16, DType::fp16}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " copy=" + std::string(dtype_name(copy)) + " shift=" +
                     std::to_string(shift));
        State got = make_state(n, 1, 11);
        State want = ref;
        if (copy == DType::fp16) {
          want = make_state(n, 1, 11);
          run_steps(scalar, want, DType::fp16, DType::fp16, 0, n);
        }
        std::vector<std::uint16_t> shifted(n + shift, 0xDEAD);
        CpuAdam simd = CpuAdam::create(options(false), 2, isa).value();
        AdamChunk c{got.param.data(), got.m.data(), got.v.data(), got.grads16[0].data(), DType::fp16,
                    shifted.data() + shift, copy, n};
        ASSERT_TRUE(simd.step(c, 1, GradScaling{512.0, 0.75}).ok());
        EXPECT_TRUE(same_bits(want.param, got.param));
        EXPECT_TRUE(std::equal(want.p16.begin(), want.p16.end(), shifted.begin() + static_cast<long>(shift)));
        EXPECT_EQ(shifted[0], 0xDEAD);  // nothing written before the chunk
      }
    }
  }
}

TEST(CpuAdam, ChunksOfATensorEqualTheWholeTensor) {
  const std::size_t n = 50'000, cut = 12'345;  // a cut that is not vector- or line-aligned
  State whole = make_state(n, 4, 1);
  State parts = whole;
  CpuAdam adam = CpuAdam::create(options(true), 2).value();
  run_steps(adam, whole, DType::bf16, DType::bf16, 0, n);
  // Each chunk sees the same step numbers, as the executor's chunks of one step do.
  run_steps(adam, parts, DType::bf16, DType::bf16, 0, cut);
  run_steps(adam, parts, DType::bf16, DType::bf16, cut, n);
  EXPECT_TRUE(same_bits(parts.param, whole.param));
  EXPECT_TRUE(same_bits(parts.m, whole.m));
  EXPECT_TRUE(same_bits(parts.v, whole.v));
  EXPECT_EQ(parts.p16, whole.p16);
}

TEST(CpuAdam, WorksWithoutA16BitCopy) {
  State s = make_state(40, 1, 3);
  CpuAdam adam = CpuAdam::create(AdamOptions{}).value();
  AdamChunk c{s.param.data(), s.m.data(), s.v.data(), s.grads32[0].data(), DType::fp32, nullptr, DType::bf16, 40};
  ASSERT_TRUE(adam.step(c, 1).ok());
  EXPECT_NE(s.param, make_state(40, 1, 3).param);  // it did update
  EXPECT_EQ(s.p16, make_state(40, 1, 3).p16);      // and wrote no copy
}

TEST(CpuAdam, FirstStepMovesEachParameterByLr) {
  // With zero state, step 1 gives m = (1-b1) g, v = (1-b2) g^2, so the update is
  // lr * g / (|g| + eps * sqrt(1-b2)) ~ lr * sign(g): a closed form independent of torch.
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, m(3, 0), v(3, 0), g = {0.3f, -4.0f, 1e-2f};
  CpuAdam adam = CpuAdam::create(AdamOptions{}).value();
  AdamChunk c{p.data(), m.data(), v.data(), g.data(), DType::fp32, nullptr, DType::bf16, 3};
  ASSERT_TRUE(adam.step(c, 1).ok());
  const double want[] = {1.0 - 1e-3, -2.0 + 1e-3, 0.5 - 1e-3};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-8) << i;
}

TEST(CpuAdam, KnownConversions) {
  const float inf = std::numeric_limits<float>::infinity();
  auto f = [](std::uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  };
  // value, bf16, fp16 (NaN rows checked separately)
  struct Row {
    float x;
    std::uint16_t bf16, fp16;
  };
  const std::vector<Row> rows = {
      {1.0f, 0x3F80, 0x3C00},          {-2.0f, 0xC000, 0xC000},
      {f(0x3F808000), 0x3F80, 0x3C04},  // bf16 tie, even below
      {f(0x3F818000), 0x3F82, 0x3C0C},  // bf16 tie, odd below: rounds up
      {65504.0f, 0x4780, 0x7BFF},      {65520.0f, 0x4780, 0x7C00},  // fp16 overflow to inf
      {inf, 0x7F80, 0x7C00},           {-inf, 0xFF80, 0xFC00},
      {std::ldexp(1.0f, -24), 0x3380, 0x0001},                     // smallest fp16 subnormal
      {std::ldexp(1.0f, -25), 0x3300, 0x0000},                     // fp16 tie to even: zero
      {f(0x00000001), 0x0000, 0x0000}, {f(0x00018000), 0x0002, 0x0000},  // fp32 subnormals kept in bf16
      {-0.0f, 0x8000, 0x8000},
  };
  for (Isa isa : supported_isas()) {
    CpuAdam adam = CpuAdam::create(AdamOptions{}, 1, isa).value();
    std::vector<float> src;
    for (const Row& r : rows) src.push_back(r.x);
    src.push_back(std::nanf(""));
    src.push_back(-std::nanf(""));
    std::vector<std::uint16_t> b(src.size()), h(src.size());
    ASSERT_TRUE(adam.convert(src.data(), b.data(), DType::bf16, src.size()).ok());
    ASSERT_TRUE(adam.convert(src.data(), h.data(), DType::fp16, src.size()).ok());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(b[i], rows[i].bf16) << isa_name(isa) << " bf16 row " << i;
      EXPECT_EQ(h[i], rows[i].fp16) << isa_name(isa) << " fp16 row " << i;
    }
    for (std::size_t i = rows.size(); i < src.size(); ++i) {
      EXPECT_EQ(b[i] & 0x7F80, 0x7F80) << "bf16 NaN stays NaN";
      EXPECT_NE(b[i] & 0x007F, 0);
      EXPECT_EQ(h[i] & 0x7C00, 0x7C00) << "fp16 NaN stays NaN";
      EXPECT_NE(h[i] & 0x03FF, 0);
    }
  }
}

TEST(CpuAdam, RejectsBadInput) {
  AdamOptions o;
  o.beta1 = 1.0;
  Result<CpuAdam> bad = CpuAdam::create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), "adam: beta1: expected a value in [0, 1), got 1");
  o = {};
  o.lr = -1;
  EXPECT_FALSE(CpuAdam::create(o).ok());
  EXPECT_FALSE(CpuAdam::create(AdamOptions{}, -1).ok());

  CpuAdam adam = CpuAdam::create(AdamOptions{}).value();
  std::vector<float> p(4), m(4), v(4), g(4);
  AdamChunk c{p.data(), m.data(), v.data(), g.data(), DType::fp32, nullptr, DType::bf16, 4};
  EXPECT_EQ(adam.step(c, 0).error(), "adam: step: expected the step number after incrementing (>= 1), got 0");
  EXPECT_FALSE(adam.step(c, 1, GradScaling{0.0, 1.0}).ok());
  EXPECT_FALSE(adam.step(c, 1, GradScaling{1.0, -1.0}).ok());
  c.param16 = p.data();
  c.param16_dtype = DType::fp32;
  EXPECT_FALSE(adam.step(c, 1).ok());
  c.param16 = nullptr;
  c.grad = nullptr;
  EXPECT_FALSE(adam.step(c, 1).ok());
  c.n = 0;
  EXPECT_EQ(*adam.step(c, 1), 0u);  // an empty chunk needs no buffers
}

// Detection agrees with the kernel's view of the CPU (/proc/cpuinfo), and forcing a path the CPU
// lacks is refused (on a CPU that has every path, there is nothing to refuse).
TEST(CpuAdam, DetectionMatchesCpuinfoAndMissingIsasAreRefused) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line + " ";
      break;
    }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
  EXPECT_EQ(isa_supported(Isa::avx512), has("avx512f") && has("avx512bw") && has("avx512vl") && has("f16c"));
  EXPECT_EQ(isa_supported(Isa::avx2), has("avx2") && has("fma") && has("f16c"));
  EXPECT_TRUE(isa_supported(Isa::scalar));
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    Result<CpuAdam> r = CpuAdam::create(AdamOptions{}, 1, isa);
    EXPECT_EQ(r.ok(), isa_supported(isa)) << isa_name(isa);
    if (!r.ok()) {
      EXPECT_NE(r.error().find("cannot run"), std::string::npos) << r.error();
    }
  }
}

TEST(CpuAdam, ParsesNames) {
  EXPECT_EQ(*parse_isa("avx512"), Isa::avx512);
  EXPECT_FALSE(parse_isa("sse").ok());
  EXPECT_EQ(*parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp8").error(), "expected fp32, fp16 or bf16, got \"fp8\"");
}

TEST(AdamBench, BytesPerParamAsInMetricsMd) {
  EXPECT_EQ(adam_bytes_per_param(DType::fp32, true), 30.0);   // 16 read + 12 + 2 written
  EXPECT_EQ(adam_bytes_per_param(DType::fp32, false), 28.0);
  EXPECT_EQ(adam_bytes_per_param(DType::bf16, true), 28.0);   // 16-bit gradient: 2 B read instead of 4
}

TEST(AdamBench, SmallRunReportsConsistentMetrics) {
  AdamBenchOptions o;
  o.params = 100'000;
  o.repeats = 2;
  Result<AdamBenchReport> r = run_adam_bench(o);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->bytes_per_param, 30.0);
  EXPECT_GT(r->params_per_s, 0);
  EXPECT_DOUBLE_EQ(r->memory_bound_params_per_s, r->triad_Bps / 30.0);
  EXPECT_DOUBLE_EQ(r->triad_Bps, 12.0 * 100'000 / r->triad_best_s);
  EXPECT_LE(r->adam_best_s, r->adam_median_s);
}

}  // namespace
}  // namespace memwall::adam
