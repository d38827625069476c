// Every kernel on every compiled backend against the cpu backend (ggml's test-backend-ops idea);
// the newer kernels (strided bias, the four attention kernels, 16-bit conversions, adam_update)
// also against an independent reference written here (plain loops in double, or CpuAdam), plus
// each backend's capacity limit, asynchronous copies with events and event_query; GEMMs at
// realistic sizes in fp16 / bf16 against the same backend's fp32. A compiled backend whose device
// is absent (cuda on a machine without a GPU) is skipped with that reason and only then, never
// with MEMWALL_REQUIRE_CUDA=1 (tests/exec/device_skip.hpp).
// Tolerance: max |x - ref| / max |ref| per output, 1e-5 for fp32 compute; GEMMs computed in
// fp16 / bf16 (fp32 accumulation) 2e-3 / 1.6e-2 (a few units of the format's rounding, 2^-11 / 2^-8).
// 16-bit conversions are compared bit for bit.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <random>
#include <string>
#include <thread>

#include "exec/adam/cpu_adam.hpp"
#include "exec/backend/backend.hpp"
#include "tests/exec/device_skip.hpp"

using namespace memwall::exec;
using memwall::adam::DType;

namespace memwall::exec {
// backend_cpu.cpp's test hook: queue a host task on a cpu backend's copy stream s.
void cpu_stream_enqueue_for_test(Backend& cpu, Stream s, std::function<void()> task);
}  // namespace memwall::exec

namespace {

// Uploads inputs, runs one kernel, downloads outputs; frees everything at the end.
class Arena {
 public:
  explicit Arena(Backend& b) : b_(b) {}
  ~Arena() {
    b_.ops().synchronize(b_.ctx());
    for (void* p : ptrs_) b_.ops().free(b_.ctx(), p);
  }
  template <typename T>
  T* up(const std::vector<T>& host) {
    T* d = alloc_array<T>(b_, host.size()).value();
    ptrs_.push_back(d);
    b_.ops().copy_h2d_async(b_.ctx(), 0, d, host.data(), host.size() * sizeof(T));
    return d;
  }
  template <typename T>
  std::vector<T> down(const T* d, std::size_t n) {
    std::vector<T> h(n);
    b_.ops().copy_d2h_async(b_.ctx(), 0, h.data(), d, n * sizeof(T));
    b_.ops().synchronize(b_.ctx());
    return h;
  }
  const BackendOps& k() { return b_.ops(); }
  void* cx() { return b_.ctx(); }

 private:
  Backend& b_;
  std::vector<void*> ptrs_;
};

std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}
std::vector<int> randi(std::size_t n, int hi, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<int> v(n);
  for (int& x : v) x = int(g() % unsigned(hi));
  return v;
}

// att as attention_scores_forward leaves it (the kernels' contract): zero above each (T, T)
// block's diagonal. lower() zeroes the same entries of an output: datt's are scratch there.
std::vector<float> causal(std::vector<float> att, int T) {
  for (std::size_t i = 0; i < att.size(); ++i)
    if (int(i % std::size_t(T)) > int(i / std::size_t(T) % std::size_t(T))) att[i] = 0.0f;
  return att;
}
template <typename F>
std::vector<F> lower(std::vector<F> att, int T) {
  for (std::size_t i = 0; i < att.size(); ++i)
    if (int(i % std::size_t(T)) > int(i / std::size_t(T) % std::size_t(T))) att[i] = F(0);
  return att;
}

using Outputs = std::vector<std::vector<float>>;
struct OpCase {
  std::string name;
  std::function<Outputs(Arena&)> run;
  // > 0: also checked with fp16 / bf16 GEMMs, within this many times the GEMM tolerance. 1 for a
  // GEMM; 4 for attention (cuda's products are GEMMs): a score's rounding error is the format's
  // unit times its magnitude (|q . k| / sqrt(hs) up to about 4 here), and exp carries it into att.
  double gemm = 0;
};

constexpr int B = 2, T = 7, C = 24, NH = 3, V = 37, BT = B * T;

std::vector<OpCase> cases() {
  std::vector<OpCase> c;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      c.push_back({std::string("gemm_") + (ta ? "T" : "N") + (tb ? "T" : "N") + "_batched",
                   [ta, tb](Arena& a) {
                     const int M = 13, N = 9, K = 21, batch = 3;
                     const long sa = M * K + 5, sb = K * N + 3, sc = M * N + 1;
                     auto A = a.up(randn(std::size_t(sa * batch), 1)), Bm = a.up(randn(std::size_t(sb * batch), 2));
                     auto Cm = a.up(randn(std::size_t(sc * batch), 3));
                     a.k().gemm(a.cx(), ta, tb, M, N, K, 0.7f, A, ta ? M : K, sa, Bm, tb ? K : N, sb, 0.5f, Cm, N, sc,
                                batch);
                     return Outputs{a.down(Cm, std::size_t(sc * batch))};
                   },
                   1});
  c.push_back({"encoder", [](Arena& a) {
                 auto tok = a.up(randi(BT, V, 4));
                 auto wte = a.up(randn(V * C, 5)), wpe = a.up(randn(T * C, 6));
                 auto out = a.up(std::vector<float>(BT * C));
                 a.k().encoder_forward(a.cx(), out, tok, wte, wpe, B, T, C);
                 auto dwte = a.up(randn(V * C, 7)), dwpe = a.up(randn(T * C, 8));
                 a.k().encoder_backward(a.cx(), dwte, dwpe, a.up(randn(BT * C, 9)), tok, B, T, C);
                 return Outputs{a.down(out, BT * C), a.down(dwte, V * C), a.down(dwpe, T * C)};
               }});
  c.push_back({"layernorm", [](Arena& a) {
                 auto x = a.up(randn(BT * C, 10, 3.0f)), w = a.up(randn(C, 11)), b = a.up(randn(C, 12));
                 auto out = a.up(std::vector<float>(BT * C)), mean = a.up(std::vector<float>(BT));
                 auto rstd = a.up(std::vector<float>(BT));
                 a.k().layernorm_forward(a.cx(), out, mean, rstd, x, w, b, BT, C);
                 auto dx = a.up(randn(BT * C, 13)), dw = a.up(randn(C, 14)), db = a.up(randn(C, 15));
                 a.k().layernorm_backward(a.cx(), dx, dw, db, a.up(randn(BT * C, 16)), x, w, mean, rstd, BT, C);
                 return Outputs{a.down(out, BT * C), a.down(mean, BT), a.down(rstd, BT), a.down(dx, BT * C),
                                a.down(dw, C), a.down(db, C)};
               }});
  c.push_back({"bias", [](Arena& a) {
                 auto out = a.up(randn(BT * C, 17)), bias = a.up(randn(C, 18)), db = a.up(randn(C, 19));
                 a.k().bias_forward(a.cx(), out, bias, BT, C, C);
                 a.k().bias_backward(a.cx(), db, a.up(randn(BT * C, 20)), BT, C, C);
                 return Outputs{a.down(out, BT * C), a.down(db, C)};
               }});
  c.push_back({"bias_strided_tile", [](Arena& a) {
                 // columns 5 .. 5 + OC of a (BT, ld) output
                 const int ld = 3 * C, off = 5, OC = C + 3;
                 auto out = a.up(randn(BT * ld, 41)), bias = a.up(randn(OC, 42)), db = a.up(randn(OC, 43));
                 a.k().bias_forward(a.cx(), out + off, bias, BT, OC, ld);
                 a.k().bias_backward(a.cx(), db, a.up(randn(BT * ld, 44)) + off, BT, OC, ld);
                 return Outputs{a.down(out, BT * ld), a.down(db, OC)};
               }});
  c.push_back({"attention_scores_forward", [](Arena& a) {
                 auto qkv = a.up(randn(BT * 3 * C, 21, 2.0f)), att = a.up(randn(B * NH * T * T, 45));
                 a.k().attention_scores_forward(a.cx(), att, qkv, B, T, C, NH, NH);
                 return Outputs{a.down(att, B * NH * T * T)};
               }, 4});
  c.push_back({"attention_context_forward", [](Arena& a) {
                 auto qkv = a.up(randn(BT * 3 * C, 21, 2.0f)), att = a.up(causal(randn(B * NH * T * T, 46), T));
                 auto out = a.up(randn(BT * C, 47));
                 a.k().attention_context_forward(a.cx(), out, att, qkv, B, T, C, NH, NH);
                 return Outputs{a.down(out, BT * C)};
               }, 4});
  c.push_back({"attention_context_backward", [](Arena& a) {
                 auto qkv = a.up(randn(BT * 3 * C, 21, 2.0f)), att = a.up(causal(randn(B * NH * T * T, 46), T));
                 auto datt = a.up(randn(B * NH * T * T, 48)), dqkv = a.up(randn(BT * 3 * C, 22));
                 a.k().attention_context_backward(a.cx(), datt, dqkv, a.up(randn(BT * C, 23)), att, qkv, B, T, C, NH, NH);
                 return Outputs{lower(a.down(datt, B * NH * T * T), T), a.down(dqkv, BT * 3 * C)};
               }, 4});
  c.push_back({"attention_scores_backward", [](Arena& a) {
                 auto qkv = a.up(randn(BT * 3 * C, 21, 2.0f)), att = a.up(causal(randn(B * NH * T * T, 46), T));
                 auto datt = a.up(randn(B * NH * T * T, 48)), dqkv = a.up(randn(BT * 3 * C, 22));
                 a.k().attention_scores_backward(a.cx(), dqkv, datt, att, qkv, B, T, C, NH, NH);
                 return Outputs{a.down(dqkv, BT * 3 * C)};
               }, 4});
  c.push_back({"attention_composed", [](Arena& a) {
                 auto qkv = a.up(randn(BT * 3 * C, 21, 2.0f));
                 auto out = a.up(std::vector<float>(BT * C)), att = a.up(std::vector<float>(B * NH * T * T));
                 a.k().attention_scores_forward(a.cx(), att, qkv, B, T, C, NH, NH);
                 a.k().attention_context_forward(a.cx(), out, att, qkv, B, T, C, NH, NH);
                 auto dqkv = a.up(randn(BT * 3 * C, 22)), datt = a.up(std::vector<float>(B * NH * T * T));
                 a.k().attention_context_backward(a.cx(), datt, dqkv, a.up(randn(BT * C, 23)), att, qkv, B, T, C, NH, NH);
                 std::vector<float> datt_h = lower(a.down(datt, B * NH * T * T), T);  // scratch after the next
                 a.k().attention_scores_backward(a.cx(), dqkv, datt, att, qkv, B, T, C, NH, NH);
                 return Outputs{a.down(out, BT * C), a.down(att, B * NH * T * T), datt_h, a.down(dqkv, BT * 3 * C)};
               }, 4});
  c.push_back({"gelu", [](Arena& a) {
                 const long N = BT * 4 * C;
                 auto x = a.up(randn(std::size_t(N), 24, 4.0f)), out = a.up(std::vector<float>(std::size_t(N)));
                 a.k().gelu_forward(a.cx(), out, x, N);
                 auto dx = a.up(randn(std::size_t(N), 25));
                 a.k().gelu_backward(a.cx(), dx, x, a.up(randn(std::size_t(N), 26)), N);
                 return Outputs{a.down(out, std::size_t(N)), a.down(dx, std::size_t(N))};
               }});
  c.push_back({"encoder_without_positions", [](Arena& a) {
                 auto tok = a.up(randi(BT, V, 4));
                 auto wte = a.up(randn(V * C, 5)), out = a.up(std::vector<float>(BT * C));
                 a.k().encoder_forward(a.cx(), out, tok, wte, nullptr, B, T, C);
                 auto dwte = a.up(randn(V * C, 7));
                 a.k().encoder_backward(a.cx(), dwte, nullptr, a.up(randn(BT * C, 9)), tok, B, T, C);
                 return Outputs{a.down(out, BT * C), a.down(dwte, V * C)};
               }});
  c.push_back({"rmsnorm", [](Arena& a) {
                 auto x = a.up(randn(BT * C, 10, 3.0f)), w = a.up(randn(C, 11));
                 auto out = a.up(std::vector<float>(BT * C)), rstd = a.up(std::vector<float>(BT));
                 a.k().rmsnorm_forward(a.cx(), out, rstd, x, w, BT, C);
                 auto dx = a.up(randn(BT * C, 13)), dw = a.up(randn(C, 14));
                 a.k().rmsnorm_backward(a.cx(), dx, dw, a.up(randn(BT * C, 16)), x, w, rstd, BT, C);
                 return Outputs{a.down(out, BT * C), a.down(rstd, BT), a.down(dx, BT * C), a.down(dw, C)};
               }});
  c.push_back({"rope_gqa", [](Arena& a) {
                 const int KVH = 1, W = C + 2 * KVH * (C / NH);
                 auto qkv = a.up(randn(std::size_t(BT) * W, 34, 2.0f));
                 a.k().rope(a.cx(), qkv, B, T, C, NH, KVH, 10000.0f, false);
                 const std::vector<float> turned = a.down(qkv, std::size_t(BT) * W);
                 a.k().rope(a.cx(), qkv, B, T, C, NH, KVH, 500000.0f, true);
                 return Outputs{turned, a.down(qkv, std::size_t(BT) * W)};
               }});
  c.push_back({"attention_composed_gqa", [](Arena& a) {
                 const int KVH = 1, W = C + 2 * KVH * (C / NH);
                 auto qkv = a.up(randn(std::size_t(BT) * W, 21, 2.0f));
                 auto out = a.up(std::vector<float>(BT * C)), att = a.up(std::vector<float>(B * NH * T * T));
                 a.k().attention_scores_forward(a.cx(), att, qkv, B, T, C, NH, KVH);
                 a.k().attention_context_forward(a.cx(), out, att, qkv, B, T, C, NH, KVH);
                 auto dqkv = a.up(randn(std::size_t(BT) * W, 22)), datt = a.up(std::vector<float>(B * NH * T * T));
                 a.k().attention_context_backward(a.cx(), datt, dqkv, a.up(randn(BT * C, 23)), att, qkv, B, T, C, NH, KVH);
                 a.k().attention_scores_backward(a.cx(), dqkv, datt, att, qkv, B, T, C, NH, KVH);
                 return Outputs{a.down(out, BT * C), a.down(att, B * NH * T * T), a.down(dqkv, std::size_t(BT) * W)};
               }, 4});
  for (bool gelu : {false, true})
    c.push_back({gelu ? "geglu" : "swiglu", [gelu](Arena& a) {
                   const int I = 2 * C;
                   auto x = a.up(randn(std::size_t(BT) * 2 * I, 24, 4.0f)), out = a.up(std::vector<float>(BT * I));
                   a.k().glu_forward(a.cx(), out, x, BT, I, gelu);
                   auto dx = a.up(randn(std::size_t(BT) * 2 * I, 25));
                   a.k().glu_backward(a.cx(), dx, x, a.up(randn(BT * I, 26)), BT, I, gelu);
                   return Outputs{a.down(out, BT * I), a.down(dx, std::size_t(BT) * 2 * I)};
                 }});
  c.push_back({"residual_accumulate", [](Arena& a) {
                 auto x = a.up(randn(BT * C, 27)), y = a.up(randn(BT * C, 28)), out = a.up(std::vector<float>(BT * C));
                 a.k().residual_forward(a.cx(), out, x, y, BT * C);
                 a.k().accumulate(a.cx(), x, out, BT * C);
                 return Outputs{a.down(out, BT * C), a.down(x, BT * C)};
               }});
  c.push_back({"crossentropy", [](Arena& a) {
                 auto logits = a.up(randn(BT * V, 29, 5.0f));
                 auto tg = a.up(randi(BT, V, 30));
                 auto probs = a.up(std::vector<float>(BT * V)), losses = a.up(std::vector<float>(BT));
                 a.k().crossentropy_forward(a.cx(), probs, losses, logits, tg, BT, V);
                 auto dl = a.up(randn(BT * V, 31));
                 a.k().crossentropy_backward(a.cx(), dl, probs, tg, 1.0f / BT, BT, V);
                 return Outputs{a.down(probs, BT * V), a.down(losses, BT), a.down(dl, BT * V)};
               }});
  c.push_back({"memset_copy_d2d", [](Arena& a) {
                 auto x = a.up(randn(100, 32)), y = a.up(randn(100, 33));
                 a.k().copy_d2d_async(a.cx(), 0, y, x, 50 * sizeof(float));
                 a.k().memset_zero(a.cx(), x, 30 * sizeof(float));
                 return Outputs{a.down(x, 100), a.down(y, 100)};
               }});
  return c;
}

double rel_error(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, std::fabs(double(x[i]) - double(ref[i])));
    den = std::max(den, std::fabs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

// The backend under test, or a skip when its device is missing (and only then).
std::unique_ptr<Backend> open_or_skip(const std::string& name, ComputeType ct, bool& skip, std::string& why,
                                      std::size_t capacity_bytes = 64 << 20) {
  BackendOptions o;
  o.compute = ct;
  o.capacity_bytes = capacity_bytes;
  auto b = create_backend(name, o);
  if (!b) {
    if (memwall::test::may_skip_for_device(b.error())) {
      skip = true;
      why = b.error();
      return nullptr;
    }
    ADD_FAILURE() << name << ": " << b.error();
    return nullptr;
  }
  return std::move(b).value();
}

class BackendTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendTest, EveryKernelMatchesTheCpuBackend) {
  auto cpu = create_backend("cpu").value();
  std::vector<ComputeType> types = {ComputeType::fp32};
  if (GetParam() != "cpu") types = {ComputeType::fp32, ComputeType::fp16, ComputeType::bf16};
  for (ComputeType ct : types) {
    bool skip = false;
    std::string why;
    auto be = open_or_skip(GetParam(), ct, skip, why);
    if (skip) GTEST_SKIP() << GetParam() << " backend compiled but not testable here: " << why;
    ASSERT_TRUE(be);
    for (const OpCase& op : cases()) {
      if (ct != ComputeType::fp32 && op.gemm == 0) continue;
      const double tol = ct == ComputeType::fp32 ? 1e-5 : (ct == ComputeType::fp16 ? 2e-3 : 1.6e-2) * op.gemm;
      Outputs ref, got;
      {
        Arena a(*cpu);
        ref = op.run(a);
      }
      {
        Arena a(*be);
        got = op.run(a);
      }
      ASSERT_EQ(ref.size(), got.size());
      for (std::size_t i = 0; i < ref.size(); ++i)
        EXPECT_LE(rel_error(got[i], ref[i]), tol)
            << GetParam() << " " << compute_type_name(ct) << " " << op.name << " output " << i;
    }
  }
}

// GEMMs at the sizes training runs them: a 4096 cube (devices only: 137 GFLOP would take the cpu
// backend's cores seconds), and the thin shapes of tiling and tensor slicing (8192 tokens against a
// quarter of 3C = 3072 columns, and against K sliced to 1024 / 8), against a double-precision
// reference on 512 sampled entries. Inputs uniform in (-1, 1): the sum's error is the inputs'
// rounding in the compute type, a random walk that keeps max |x - ref| / max |ref| near the
// format's unit: fp32 1e-5, fp16 2e-3, bf16 1.6e-2, as the small GEMMs above.
TEST_P(BackendTest, GemmsAtTrainingSizesMatchADoubleReference) {
  struct G {
    int M, N, K;
    bool ta, tb;
  };
  std::vector<G> shapes = {{8192, 768, 1024, false, true}, {8192, 1024, 128, false, false}, {1024, 768, 8192, true, false}};
  if (GetParam() != "cpu") shapes.insert(shapes.begin(), G{4096, 4096, 4096, false, false});
  std::vector<ComputeType> types = {ComputeType::fp32};
  if (GetParam() != "cpu") types = {ComputeType::fp32, ComputeType::fp16, ComputeType::bf16};
  for (ComputeType ct : types) {
    bool skip = false;
    std::string why;
    auto be = open_or_skip(GetParam(), ct, skip, why, std::size_t(512) << 20);
    if (skip) GTEST_SKIP() << GetParam() << " backend compiled but not testable here: " << why;
    ASSERT_TRUE(be);
    for (const G& g : shapes) {
      const std::string what = std::to_string(g.M) + "x" + std::to_string(g.N) + "x" + std::to_string(g.K) + " " +
                               compute_type_name(ct);
      const std::vector<float> A = randn(std::size_t(g.M) * g.K, 101), Bm = randn(std::size_t(g.K) * g.N, 102);
      Arena a(*be);
      float* d_c = a.up(std::vector<float>(std::size_t(g.M) * g.N));
      float* d_a = a.up(A);
      float* d_b = a.up(Bm);
      auto gemm = [&] {
        a.k().gemm(a.cx(), g.ta, g.tb, g.M, g.N, g.K, 1.0f, d_a, g.ta ? g.M : g.K, 0, d_b, g.tb ? g.K : g.N, 0, 0.0f,
                   d_c, g.N, 0, 1);
      };
      gemm();  // the first call chooses and loads the kernel; the second is timed (not asserted)
      be->ops().synchronize(be->ctx());
      const auto t0 = std::chrono::steady_clock::now();
      gemm();
      be->ops().synchronize(be->ctx());
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::vector<float> got = a.down(d_c, std::size_t(g.M) * g.N);
      // op(A)[i, k] and op(B)[k, j] of the row-major inputs
      auto at = [&](int i, int k) { return double(g.ta ? A[std::size_t(k) * g.M + i] : A[std::size_t(i) * g.K + k]); };
      auto bt = [&](int k, int j) { return double(g.tb ? Bm[std::size_t(j) * g.K + k] : Bm[std::size_t(k) * g.N + j]); };
      std::mt19937 pick(7);
      double num = 0, den = 0;
      for (int n = 0; n < 512; ++n) {
        const int i = int(pick() % unsigned(g.M)), j = int(pick() % unsigned(g.N));
        double ref = 0;
        for (int k = 0; k < g.K; ++k) ref += at(i, k) * bt(k, j);
        num = std::max(num, std::fabs(double(got[std::size_t(i) * g.N + j]) - ref));
        den = std::max(den, std::fabs(ref));
      }
      const double tol = ct == ComputeType::fp32 ? 1e-5 : ct == ComputeType::fp16 ? 2e-3 : 1.6e-2;
      EXPECT_LE(num / den, tol) << what;
      std::printf("  gemm %-22s rel %.2e (tolerance %.1e), %.1f TFLOPS\n", what.c_str(), num / den, tol,
                  2.0 * g.M * g.N * g.K / secs / 1e12);
    }
  }
}

TEST_P(BackendTest, AllocationBeyondCapacityFailsLikeOutOfMemory) {
  bool skip = false;
  std::string why;
  auto be = open_or_skip(GetParam(), ComputeType::fp32, skip, why);
  if (skip) GTEST_SKIP() << GetParam() << " backend compiled but not testable here: " << why;
  ASSERT_TRUE(be);
  EXPECT_EQ(be->caps().capacity_bytes, std::size_t(64) << 20);
  // the backend's own workspaces come out of the capacity (cuda: cuBLAS's, 1/16 of a small device)
  EXPECT_LE(be->caps().reserved_bytes, be->caps().capacity_bytes / 16);
  EXPECT_EQ(be->ops().used_bytes(be->ctx()), be->caps().reserved_bytes);
  auto a = be->ops().alloc(be->ctx(), 40 << 20);
  ASSERT_TRUE(a.ok());
  auto b = be->ops().alloc(be->ctx(), 40 << 20);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().find("out of memory"), std::string::npos) << b.error();
  be->ops().free(be->ctx(), *a);
  EXPECT_EQ(be->ops().used_bytes(be->ctx()), be->caps().reserved_bytes);
  auto c = be->ops().alloc(be->ctx(), 40 << 20);
  ASSERT_TRUE(c.ok()) << "freed memory is available again";
  be->ops().free(be->ctx(), *c);
}

TEST_P(BackendTest, AsyncCopiesOnStreamsWithEvents) {
  bool skip = false;
  std::string why;
  auto be = open_or_skip(GetParam(), ComputeType::fp32, skip, why);
  if (skip) GTEST_SKIP() << GetParam() << " backend compiled but not testable here: " << why;
  ASSERT_TRUE(be);
  const BackendOps& k = be->ops();
  void* cx = be->ctx();
  const std::size_t n = 1 << 20;
  std::vector<float> src = randn(n, 40), back(n, 0.0f);
  memwall::Result<bool> pinned = k.host_register ? k.host_register(cx, src.data(), n * 4) : memwall::Result<bool>(false);
  float* d = alloc_array<float>(*be, n).value();
  float* d2 = alloc_array<float>(*be, n).value();
  Stream up = k.stream_create(cx).value(), down = k.stream_create(cx).value();
  Event uploaded = k.event_create(cx), scaled = k.event_create(cx), done = k.event_create(cx);
  // up: h2d; compute waits, doubles it into d2; down waits for compute, d2h
  k.copy_h2d_async(cx, up, d, src.data(), n * 4);
  k.event_record(cx, uploaded, up);
  k.stream_wait_event(cx, 0, uploaded);
  k.residual_forward(cx, d2, d, d, long(n));
  k.event_record(cx, scaled, 0);
  k.stream_wait_event(cx, down, scaled);
  k.copy_d2h_async(cx, down, back.data(), d2, n * 4);
  k.event_record(cx, done, down);
  k.event_synchronize(cx, done);
  for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(back[i], 2 * src[i]) << i;
  k.event_destroy(cx, uploaded);
  k.event_destroy(cx, scaled);
  k.event_destroy(cx, done);
  if (pinned.ok() && *pinned) k.host_unregister(cx, src.data());
  k.free(cx, d);
  k.free(cx, d2);
}

// ---- independent references: plain loops in double precision ----

// qkv (B, T, QW), QW = C + 2*KVH*hs: query head h at h*hs of [0:C], its key and value head
// h / (NH/KVH) at that times hs in [C:C+KVH*hs] and [C+KVH*hs:QW] of each position (KVH 0: NH).
struct Shape {
  int B, T, C, NH, KVH = 0;
  int hs() const { return C / NH; }
  int kvh() const { return KVH > 0 ? KVH : NH; }
  std::size_t width() const { return std::size_t(C) + 2 * std::size_t(kvh()) * hs(); }
  std::size_t qkv(int b, int t, int part, int h, int i) const {
    const std::size_t head = part == 0 ? std::size_t(h) : std::size_t(h / (NH / kvh()));
    const std::size_t at = part == 0 ? 0 : std::size_t(C) + std::size_t(part - 1) * kvh() * hs();
    return (std::size_t(b) * T + std::size_t(t)) * width() + at + head * hs() + i;
  }
  std::size_t att(int b, int h, int t, int t2) const {
    return ((std::size_t(b) * NH + std::size_t(h)) * T + std::size_t(t)) * T + std::size_t(t2);
  }
  std::size_t out(int b, int t, int h, int i) const {
    return (std::size_t(b) * T + std::size_t(t)) * C + std::size_t(h) * hs() + i;
  }
  std::size_t n_qkv() const { return std::size_t(B) * T * width(); }
  std::size_t n_att() const { return std::size_t(B) * NH * T * T; }
  std::size_t n_out() const { return std::size_t(B) * T * C; }
};

template <typename Q>
std::vector<double> ref_scores(const Shape& s, const std::vector<Q>& qkv) {
  std::vector<double> att(s.n_att(), 0.0);
  const double scale = 1.0 / std::sqrt(double(s.hs()));
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        std::vector<double> pre(std::size_t(t) + 1);
        double maxv = -INFINITY, sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0;
          for (int i = 0; i < s.hs(); ++i)
            dot += double(qkv[s.qkv(b, t, 0, h, i)]) * double(qkv[s.qkv(b, t2, 1, h, i)]);
          pre[std::size_t(t2)] = dot * scale;
          maxv = std::max(maxv, pre[std::size_t(t2)]);
        }
        for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(pre[std::size_t(t2)] - maxv);
        for (int t2 = 0; t2 <= t; ++t2) att[s.att(b, h, t, t2)] = std::exp(pre[std::size_t(t2)] - maxv) / sum;
      }
  return att;
}

template <typename A, typename Q>
std::vector<double> ref_context(const Shape& s, const std::vector<A>& att, const std::vector<Q>& qkv) {
  std::vector<double> out(s.n_out(), 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t)
        for (int i = 0; i < s.hs(); ++i) {
          double acc = 0;
          for (int t2 = 0; t2 <= t; ++t2) acc += double(att[s.att(b, h, t, t2)]) * double(qkv[s.qkv(b, t2, 2, h, i)]);
          out[s.out(b, t, h, i)] = acc;
        }
  return out;
}

// datt += dout . v^T (t2 <= t), dv += att^T . dout, on top of the given starting values
template <typename A>
void ref_context_backward(const Shape& s, std::vector<double>& datt, std::vector<double>& dqkv,
                          const std::vector<float>& dout, const std::vector<A>& att, const std::vector<float>& qkv) {
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t)
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0;
          for (int i = 0; i < s.hs(); ++i) {
            dot += double(dout[s.out(b, t, h, i)]) * double(qkv[s.qkv(b, t2, 2, h, i)]);
            dqkv[s.qkv(b, t2, 2, h, i)] += double(att[s.att(b, h, t, t2)]) * double(dout[s.out(b, t, h, i)]);
          }
          datt[s.att(b, h, t, t2)] += dot;
        }
}

// softmax backward over t2 <= t, then dq += scale dpre . k, dk += scale dpre^T . q
template <typename A, typename D>
void ref_scores_backward(const Shape& s, std::vector<double>& dqkv, const std::vector<D>& datt,
                         const std::vector<A>& att, const std::vector<float>& qkv) {
  const double scale = 1.0 / std::sqrt(double(s.hs()));
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        double dot = 0;
        for (int t2 = 0; t2 <= t; ++t2) dot += double(att[s.att(b, h, t, t2)]) * double(datt[s.att(b, h, t, t2)]);
        for (int t2 = 0; t2 <= t; ++t2) {
          const double dpre = double(att[s.att(b, h, t, t2)]) * (double(datt[s.att(b, h, t, t2)]) - dot);
          for (int i = 0; i < s.hs(); ++i) {
            dqkv[s.qkv(b, t, 0, h, i)] += scale * dpre * double(qkv[s.qkv(b, t2, 1, h, i)]);
            dqkv[s.qkv(b, t2, 1, h, i)] += scale * dpre * double(qkv[s.qkv(b, t, 0, h, i)]);
          }
        }
      }
}

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

double rel_error(const std::vector<float>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, std::fabs(double(x[i]) - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  return den > 0 ? num / den : num;
}

#define OPEN_OR_SKIP(be, ct)                                                                      \
  bool skip_ = false;                                                                             \
  std::string why_;                                                                               \
  auto be = open_or_skip(GetParam(), ct, skip_, why_);                                            \
  if (skip_) GTEST_SKIP() << GetParam() << " backend compiled but not testable here: " << why_;  \
  ASSERT_TRUE(be)

TEST_P(BackendTest, StridedBiasMatchesANaiveReference) {
  OPEN_OR_SKIP(be, ComputeType::fp32);
  // a tile of OC columns at column off of a (BT, ld) output
  const int rows = 11, ld = 40, off = 7, OC = 29;
  const std::vector<float> out0 = randn(std::size_t(rows) * ld, 50), bias = randn(OC, 51), db0 = randn(OC, 52);
  const std::vector<float> dout = randn(std::size_t(rows) * ld, 53);
  Arena a(*be);
  float* out = a.up(out0);
  float* db = a.up(db0);
  a.k().bias_forward(a.cx(), out + off, a.up(bias), rows, OC, ld);
  a.k().bias_backward(a.cx(), db, a.up(dout) + off, rows, OC, ld);
  std::vector<double> out_ref = widen(out0), db_ref = widen(db0);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < OC; ++o) {
      out_ref[std::size_t(r) * ld + off + o] += bias[std::size_t(o)];
      db_ref[std::size_t(o)] += dout[std::size_t(r) * ld + off + o];
    }
  const std::vector<float> got = a.down(out, out0.size());
  EXPECT_LE(rel_error(got, out_ref), 1e-6) << "bias_forward";
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::size_t col = i % ld;
    if (col < std::size_t(off) || col >= std::size_t(off + OC)) {
      ASSERT_EQ(got[i], out0[i]) << "column " << col << " is outside the tile";
    }
  }
  EXPECT_LE(rel_error(a.down(db, db0.size()), db_ref), 1e-5) << "bias_backward";
}

TEST_P(BackendTest, AttentionKernelsMatchANaiveReference) {
  OPEN_OR_SKIP(be, ComputeType::fp32);
  // the second shape has rows longer than a warp (T > 32)
  // the second shape has rows longer than a warp (T > 32); the last two share key/value heads (MQA, GQA)
  for (const Shape s : {Shape{B, T, C, NH}, Shape{1, 45, 16, 2}, Shape{B, T, C, NH, 1}, Shape{2, 37, 32, 4, 2}}) {
    SCOPED_TRACE("B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " C " + std::to_string(s.C) + " NH " +
                 std::to_string(s.NH) + " KVH " + std::to_string(s.kvh()));
    const std::vector<float> qkv = randn(s.n_qkv(), 60, 2.0f), dout = randn(s.n_out(), 61);
    const std::vector<float> dqkv0 = randn(s.n_qkv(), 62), datt0 = randn(s.n_att(), 63);
    Arena a(*be);
    float* d_qkv = a.up(qkv);
    float* d_dout = a.up(dout);
    // each kernel on its own, from the same float inputs as the reference
    float* att = a.up(randn(s.n_att(), 64));
    a.k().attention_scores_forward(a.cx(), att, d_qkv, s.B, s.T, s.C, s.NH, s.kvh());
    const std::vector<float> att_f = a.down(att, s.n_att());
    EXPECT_LE(rel_error(att_f, ref_scores(s, qkv)), 1e-5) << "attention_scores_forward";
    float* out = a.up(randn(s.n_out(), 65));
    a.k().attention_context_forward(a.cx(), out, att, d_qkv, s.B, s.T, s.C, s.NH, s.kvh());
    EXPECT_LE(rel_error(a.down(out, s.n_out()), ref_context(s, att_f, qkv)), 1e-5) << "attention_context_forward";
    float* datt = a.up(datt0);
    float* dqkv = a.up(dqkv0);
    a.k().attention_context_backward(a.cx(), datt, dqkv, d_dout, att, d_qkv, s.B, s.T, s.C, s.NH, s.kvh());
    std::vector<double> datt_ref = widen(datt0), dqkv_ref = widen(dqkv0);
    ref_context_backward(s, datt_ref, dqkv_ref, dout, att_f, qkv);
    const std::vector<float> datt_f = a.down(datt, s.n_att());
    EXPECT_LE(rel_error(lower(datt_f, s.T), lower(datt_ref, s.T)), 1e-5) << "attention_context_backward datt";
    EXPECT_LE(rel_error(a.down(dqkv, s.n_qkv()), dqkv_ref), 1e-5) << "attention_context_backward dqkv";
    float* dqkv2 = a.up(dqkv0);
    a.k().attention_scores_backward(a.cx(), dqkv2, datt, att, d_qkv, s.B, s.T, s.C, s.NH, s.kvh());
    std::vector<double> dqkv2_ref = widen(dqkv0);
    ref_scores_backward(s, dqkv2_ref, datt_f, att_f, qkv);
    EXPECT_LE(rel_error(a.down(dqkv2, s.n_qkv()), dqkv2_ref), 1e-5) << "attention_scores_backward";
  }
}

TEST_P(BackendTest, ComposedAttentionIsAttentionInDoublePrecision) {
  OPEN_OR_SKIP(be, ComputeType::fp32);
  for (const Shape s : {Shape{B, T, C, NH}, Shape{2, 40, 32, 4}, Shape{2, 40, 32, 4, 1}, Shape{2, 40, 64, 8, 2}}) {
    SCOPED_TRACE("T " + std::to_string(s.T) + " KVH " + std::to_string(s.kvh()));
    const std::vector<float> qkv = randn(s.n_qkv(), 70, 2.0f), dout = randn(s.n_out(), 71);
    // forward: att = causal softmax(q . k / sqrt(hs)), out = att . v; backward from dout, all in double
    const std::vector<double> att_ref = ref_scores(s, qkv), out_ref = ref_context(s, att_ref, qkv);
    std::vector<double> datt_ref(s.n_att(), 0.0), dqkv_ref(s.n_qkv(), 0.0);
    ref_context_backward(s, datt_ref, dqkv_ref, dout, att_ref, qkv);
    ref_scores_backward(s, dqkv_ref, datt_ref, att_ref, qkv);
    // the four kernels in sequence, as exec/gpt calls them
    Arena a(*be);
    float* d_qkv = a.up(qkv);
    float* att = a.up(std::vector<float>(s.n_att()));
    float* out = a.up(std::vector<float>(s.n_out()));
    float* datt = a.up(std::vector<float>(s.n_att()));
    float* dqkv = a.up(std::vector<float>(s.n_qkv()));
    a.k().attention_scores_forward(a.cx(), att, d_qkv, s.B, s.T, s.C, s.NH, s.kvh());
    a.k().attention_context_forward(a.cx(), out, att, d_qkv, s.B, s.T, s.C, s.NH, s.kvh());
    a.k().attention_context_backward(a.cx(), datt, dqkv, a.up(dout), att, d_qkv, s.B, s.T, s.C, s.NH, s.kvh());
    a.k().attention_scores_backward(a.cx(), dqkv, datt, att, d_qkv, s.B, s.T, s.C, s.NH, s.kvh());
    EXPECT_LE(rel_error(a.down(out, s.n_out()), out_ref), 1e-5) << "out";
    EXPECT_LE(rel_error(a.down(dqkv, s.n_qkv()), dqkv_ref), 1e-5) << "dqkv";
    // zeros above the diagonal
    const std::vector<float> att_f = a.down(att, s.n_att());
    for (int t = 0; t < s.T; ++t)
      for (int t2 = t + 1; t2 < s.T; ++t2) ASSERT_EQ(att_f[s.att(s.B - 1, s.NH - 1, t, t2)], 0.0f);
  }
}

// RMSNorm, rotary positions and the gated activations against their definitions in double:
// rmsnorm and its gradients (checked against a central difference of the double forward), rope
// against the rotation of each channel pair written out, SwiGLU / GeGLU and their gradients.
TEST_P(BackendTest, LlamaBlockKernelsMatchTheirDefinitionsInDouble) {
  OPEN_OR_SKIP(be, ComputeType::fp32);
  Arena a(*be);
  {  // RMSNorm
    const int rows = 9, cols = 40;
    const std::vector<float> x = randn(std::size_t(rows) * cols, 80, 3.0f), w = randn(cols, 81),
                             dout = randn(std::size_t(rows) * cols, 82);
    float *out = a.up(std::vector<float>(x.size())), *rstd = a.up(std::vector<float>(rows));
    float *dx = a.up(std::vector<float>(x.size())), *dw = a.up(std::vector<float>(cols));
    float *d_x = a.up(x), *d_w = a.up(w);
    a.k().rmsnorm_forward(a.cx(), out, rstd, d_x, d_w, rows, cols);
    a.k().rmsnorm_backward(a.cx(), dx, dw, a.up(dout), d_x, d_w, rstd, rows, cols);
    // f(x, w) = sum over the row of dout * x * w / sqrt(mean(x^2) + eps): its gradients by central differences
    auto loss = [&](const std::vector<double>& xr, const std::vector<double>& wr, int r) {
      double ss = 0;
      for (int i = 0; i < cols; ++i) ss += xr[std::size_t(i)] * xr[std::size_t(i)];
      const double s = 1.0 / std::sqrt(ss / cols + 1e-5);
      double l = 0;
      for (int i = 0; i < cols; ++i) l += double(dout[std::size_t(r) * cols + i]) * xr[std::size_t(i)] * s * wr[std::size_t(i)];
      return l;
    };
    std::vector<double> out_ref(x.size()), dx_ref(x.size()), dw_ref(cols, 0.0);
    const std::vector<double> wd(w.begin(), w.end());
    for (int r = 0; r < rows; ++r) {
      std::vector<double> xr(x.begin() + long(r) * cols, x.begin() + long(r + 1) * cols);
      double ss = 0;
      for (double v : xr) ss += v * v;
      const double s = 1.0 / std::sqrt(ss / cols + 1e-5);
      for (int i = 0; i < cols; ++i) out_ref[std::size_t(r) * cols + i] = xr[std::size_t(i)] * s * wd[std::size_t(i)];
      const double h = 1e-5;
      for (int i = 0; i < cols; ++i) {
        std::vector<double> up = xr, dn = xr;
        up[std::size_t(i)] += h, dn[std::size_t(i)] -= h;
        dx_ref[std::size_t(r) * cols + i] = (loss(up, wd, r) - loss(dn, wd, r)) / (2 * h);
        std::vector<double> wu = wd, wdn = wd;
        wu[std::size_t(i)] += h, wdn[std::size_t(i)] -= h;
        dw_ref[std::size_t(i)] += (loss(xr, wu, r) - loss(xr, wdn, r)) / (2 * h);
      }
    }
    EXPECT_LE(rel_error(a.down(out, x.size()), out_ref), 1e-6) << "rmsnorm_forward";
    EXPECT_LE(rel_error(a.down(dx, x.size()), dx_ref), 1e-5) << "rmsnorm_backward dinp";
    EXPECT_LE(rel_error(a.down(dw, std::size_t(cols)), dw_ref), 1e-5) << "rmsnorm_backward dweight";
  }
  {  // rotary positions: NH 4 query heads, KVH 2, hs 6; v untouched
    const int b = 2, t = 5, c = 24, nh = 4, kvh = 2, hs = c / nh, w = c + 2 * kvh * hs;
    const double theta = 500000;
    const std::vector<float> x = randn(std::size_t(b) * t * w, 83);
    float* d = a.up(x);
    a.k().rope(a.cx(), d, b, t, c, nh, kvh, float(theta), false);
    const std::vector<float> got = a.down(d, x.size());
    std::vector<double> ref(x.begin(), x.end());
    for (int bt = 0; bt < b * t; ++bt)
      for (int h = 0; h < nh + kvh; ++h)
        for (int i = 0; i < hs / 2; ++i) {
          const double ang = double(bt % t) * std::pow(theta, -2.0 * i / hs);
          const std::size_t p1 = std::size_t(bt) * w + std::size_t(h) * hs + i, p2 = p1 + hs / 2;
          ref[p1] = double(x[p1]) * std::cos(ang) - double(x[p2]) * std::sin(ang);
          ref[p2] = double(x[p2]) * std::cos(ang) + double(x[p1]) * std::sin(ang);
        }
    EXPECT_LE(rel_error(got, ref), 1e-6) << "rope";
    a.k().rope(a.cx(), d, b, t, c, nh, kvh, float(theta), true);
    EXPECT_LE(rel_error(a.down(d, x.size()), widen(x)), 1e-6) << "rope inverse undoes it";
  }
  for (bool gelu : {false, true}) {  // SwiGLU, GeGLU
    const long rows = 7;
    const int I = 33;
    const std::vector<float> x = randn(std::size_t(rows) * 2 * I, 84, 4.0f), dout = randn(std::size_t(rows) * I, 85);
    float* d_x = a.up(x);
    float* out = a.up(std::vector<float>(std::size_t(rows) * I));
    float* dx = a.up(std::vector<float>(x.size()));
    a.k().glu_forward(a.cx(), out, d_x, rows, I, gelu);
    a.k().glu_backward(a.cx(), dx, d_x, a.up(dout), rows, I, gelu);
    auto act = [gelu](double g) {
      return gelu ? 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) : g / (1 + std::exp(-g));
    };
    std::vector<double> out_ref(std::size_t(rows) * I), dx_ref(x.size());
    for (long r = 0; r < rows; ++r)
      for (int i = 0; i < I; ++i) {
        const double g = x[std::size_t(r * 2 * I + i)], u = x[std::size_t(r * 2 * I + I + i)], d = dout[std::size_t(r * I + i)];
        out_ref[std::size_t(r * I + i)] = act(g) * u;
        const double h = 1e-6;
        dx_ref[std::size_t(r * 2 * I + i)] = d * u * (act(g + h) - act(g - h)) / (2 * h);
        dx_ref[std::size_t(r * 2 * I + I + i)] = d * act(g);
      }
    EXPECT_LE(rel_error(a.down(out, out_ref.size()), out_ref), 1e-6) << (gelu ? "geglu" : "swiglu") << " forward";
    EXPECT_LE(rel_error(a.down(dx, x.size()), dx_ref), 1e-5) << (gelu ? "geglu" : "swiglu") << " backward";
  }
}

// ---- 16-bit conversions ----

float f_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t u_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The cases rounding can get wrong, then random bit patterns over the whole range (NaNs made
// canonical: CpuAdam's vector paths carry NaN payload bits into fp16 where its scalar path does not).
std::vector<float> conversion_inputs() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0.1f, -3.14159f, 65504.0f, -65504.0f,
                          65519.996f,        // just below fp16's overflow threshold: 65504
                          65520.0f,          // halfway to 65536: ties to even, inf
                          -65520.0f, 65536.0f, 1e10f, -1e30f, std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                          0x1.0p-14f, 0x1.ffcp-15f,              // smallest fp16 normal; largest subnormal
                          0x1.ffep-15f, 0x1.ffdp-15f,            // rounding up into the normal range, or not
                          0x1.0p-24f, -0x1.0p-24f,               // smallest fp16 subnormal
                          0x1.0p-25f, -0x1.0p-25f,               // halfway to 0: ties to even, 0
                          0x1.000002p-25f,                       // just above: 2^-24
                          0x1.8p-24f,                            // 1.5 units: ties to even, 2 units
                          0x1.4p-23f,                            // 2.5 units: ties to even, 2 units
                          0x1.0p-30f, 1e-40f, -1e-45f,           // fp32 subnormals: 0
                          0x1.002p0f, 0x1.006p0f, -0x1.002p0f,   // fp16 ties at 1: to even (down, up)
                          0x1.01p0f, 0x1.03p0f, -0x1.03p0f,      // bf16 ties at 1: to even (down, up)
                          0x1.fep127f, 0x1.ff0p127f};            // bf16 overflow: ties to inf
  std::mt19937 g(80);
  for (int i = 0; i < 20000; ++i) {
    float f = f_of(std::uint32_t(g()));
    if (std::isnan(f)) f = std::numeric_limits<float>::quiet_NaN();
    v.push_back(f);
  }
  return v;
}

// fp16 -> double by its definition: (-1)^s 2^(e-15) (1 + m/1024), or 2^-14 (m/1024) when e == 0
double ref_fp16_value(std::uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e == 0 ? std::ldexp(m / 1024.0, -14) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1 + m / 1024.0, e - 15);
  return sign ? -v : v;
}
// bf16 -> double: the top half of an fp32
double ref_bf16_value(std::uint16_t h) { return double(f_of(std::uint32_t(h) << 16)); }

std::vector<std::uint16_t> cpu_adam_convert(const std::vector<float>& src, DType t, memwall::adam::Isa isa) {
  std::vector<std::uint16_t> out(src.size());
  auto adam = memwall::adam::CpuAdam::create(memwall::adam::AdamOptions{}, 2, isa).value();
  EXPECT_TRUE(adam.convert(src.data(), out.data(), t, src.size()).ok());
  return out;
}

// Gradient clipping's sums of squares: every element widened and squared in double, split into
// `parts` partial sums that add up (in order) to the sum over the whole array within double
// rounding, the same bits on every call; for 16-bit inputs, of the values as widened.
TEST_P(BackendTest, SumSquaresAddUpToTheWholeArrayInDouble) {
  OPEN_OR_SKIP(be, ComputeType::fp32);
  const std::vector<float> x = randn(100003, 17, 2.0f);
  for (DType t : {DType::fp32, DType::fp16, DType::bf16}) {
    SCOPED_TRACE(std::string(memwall::adam::dtype_name(t)));
    Arena a(*be);
    const void* dx = a.up(x);
    std::vector<float> widened = x;
    if (t != DType::fp32) {
      auto* h16 = a.up(std::vector<std::uint16_t>(x.size()));
      a.k().from_fp32(a.cx(), h16, a.up(x), t, long(x.size()));
      float* w = a.up(std::vector<float>(x.size()));
      a.k().to_fp32(a.cx(), w, h16, t, long(x.size()));
      widened = a.down(w, x.size());
      dx = h16;
    }
    long double want = 0;
    for (float v : widened) want += static_cast<long double>(v) * v;
    for (int parts : {1, 7, 64}) {
      double* d = a.up(std::vector<double>(std::size_t(parts), -1.0));
      a.k().sum_squares(a.cx(), d, parts, dx, t, long(x.size()));
      const std::vector<double> got = a.down(d, std::size_t(parts));
      a.k().sum_squares(a.cx(), d, parts, dx, t, long(x.size()));
      EXPECT_EQ(a.down(d, std::size_t(parts)), got) << "a second call, other bits";
      double sum = 0;
      for (double p : got) {
        EXPECT_GE(p, 0);
        sum += p;
      }
      EXPECT_NEAR(sum, double(want), 1e-12 * double(want)) << parts << " parts";
    }
  }
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // the host's sum: element i into lane i % 8, then the lanes
  for (std::size_t i = 0; i < x.size(); ++i) lanes[i % 8] += double(x[i]) * x[i];
  double in_lanes = 0;
  for (double l : lanes) in_lanes += l;
  EXPECT_EQ(host_sum_squares(x.data(), DType::fp32, x.size()), in_lanes);
}

TEST_P(BackendTest, ConversionsRoundAsCpuAdam) {
  OPEN_OR_SKIP(be, ComputeType::fp32);
  const std::vector<float> src = conversion_inputs();
  const long n = long(src.size());
  for (DType t : {DType::fp16, DType::bf16}) {
    SCOPED_TRACE(std::string(memwall::adam::dtype_name(t)));
    Arena a(*be);
    // from_fp32: bit for bit what CpuAdam writes for its copy, on every instruction set it has
    auto* h16 = a.up(std::vector<std::uint16_t>(src.size()));
    a.k().from_fp32(a.cx(), h16, a.up(src), t, n);
    const std::vector<std::uint16_t> got = a.down(h16, src.size());
    for (memwall::adam::Isa isa : memwall::adam::supported_isas()) {
      const std::vector<std::uint16_t> want = cpu_adam_convert(src, t, isa);
      for (std::size_t i = 0; i < src.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << std::hexfloat << src[i] << " (0x" << std::hex << u_of(src[i]) << ") on "
                                   << memwall::adam::isa_name(isa);
    }
    // to_fp32: exact, by the format's definition
    float* f32 = a.up(std::vector<float>(src.size()));
    a.k().to_fp32(a.cx(), f32, h16, t, n);
    const std::vector<float> back = a.down(f32, src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
      const double want = t == DType::fp16 ? ref_fp16_value(got[i]) : ref_bf16_value(got[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(back[i])) << std::hex << got[i];
        ASSERT_EQ(std::signbit(back[i]), (got[i] & 0x8000) != 0) << std::hex << got[i];
      } else {
        ASSERT_EQ(double(back[i]), want) << std::hex << got[i];
        ASSERT_EQ(std::signbit(back[i]), std::signbit(want)) << std::hex << got[i];
      }
    }
    // accumulate_to: round(float(dst) + src), the rounding CpuAdam's (the sum is the host's: on
    // x86, NaNs propagate as the backends' add_f32 makes them)
    const std::vector<float> add = randn(src.size(), 81, 3.0f);
    a.k().accumulate_to(a.cx(), h16, a.up(add), t, n);
    std::vector<float> sum(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) sum[i] = back[i] + add[i];
    const std::vector<std::uint16_t> acc = a.down(h16, src.size());
    const std::vector<std::uint16_t> want = cpu_adam_convert(sum, t, memwall::adam::Isa::scalar);
    for (std::size_t i = 0; i < src.size(); ++i) ASSERT_EQ(acc[i], want[i]) << i;
  }
  // fp32: a copy, and dst += src
  Arena a(*be);
  std::vector<float> finite;
  for (float f : src)
    if (std::isfinite(f) && std::fabs(f) < 1e30f) finite.push_back(f);
  const long nf = long(finite.size());
  float* x = a.up(std::vector<float>(finite.size()));
  a.k().from_fp32(a.cx(), x, a.up(finite), DType::fp32, nf);
  EXPECT_EQ(a.down(x, finite.size()), finite);
  float* y = a.up(std::vector<float>(finite.size()));
  a.k().to_fp32(a.cx(), y, x, DType::fp32, nf);
  EXPECT_EQ(a.down(y, finite.size()), finite);
  const std::vector<float> add = randn(finite.size(), 82);
  a.k().accumulate_to(a.cx(), y, a.up(add), DType::fp32, nf);
  std::vector<float> want(finite.size());
  for (std::size_t i = 0; i < finite.size(); ++i) want[i] = finite[i] + add[i];
  EXPECT_EQ(a.down(y, finite.size()), want);
}

TEST_P(BackendTest, ConversionsAreBitIdenticalToTheCpuBackend) {
  OPEN_OR_SKIP(be, ComputeType::fp32);
  auto cpu = create_backend("cpu").value();
  // here NaNs keep their payloads: the backends must agree on those too
  std::vector<float> src = conversion_inputs();
  for (std::uint32_t u : {0x7FC12345u, 0xFF801234u, 0x7F800001u, 0xFFFFFFFFu}) src.push_back(f_of(u));
  std::vector<std::uint16_t> halves;
  for (std::uint32_t h = 0; h < 0x10000; ++h) halves.push_back(std::uint16_t(h));  // every 16-bit pattern
  const std::vector<float> add = randn(halves.size(), 83, 4.0f);
  auto run = [&](Backend& b, DType t) {
    Arena a(b);
    std::vector<std::vector<std::uint32_t>> out;
    auto* h16 = a.up(std::vector<std::uint16_t>(src.size()));
    a.k().from_fp32(a.cx(), h16, a.up(src), t, long(src.size()));
    const std::vector<std::uint16_t> r = a.down(h16, src.size());
    out.emplace_back(r.begin(), r.end());
    float* f = a.up(std::vector<float>(halves.size()));
    a.k().to_fp32(a.cx(), f, a.up(halves), t, long(halves.size()));
    std::vector<std::uint32_t> fb;
    for (float x : a.down(f, halves.size())) fb.push_back(u_of(x));
    out.push_back(fb);
    auto* acc = a.up(halves);
    a.k().accumulate_to(a.cx(), acc, a.up(add), t, long(halves.size()));
    const std::vector<std::uint16_t> ra = a.down(acc, halves.size());
    out.emplace_back(ra.begin(), ra.end());
    return out;
  };
  for (DType t : {DType::fp16, DType::bf16}) {
    const auto want = run(*cpu, t), got = run(*be, t);
    const char* what[] = {"from_fp32", "to_fp32", "accumulate_to"};
    for (std::size_t k = 0; k < want.size(); ++k)
      for (std::size_t i = 0; i < want[k].size(); ++i)
        ASSERT_EQ(got[k][i], want[k][i]) << memwall::adam::dtype_name(t) << " " << what[k] << " element " << i;
  }
}

// ---- adam_update ----

struct AdamCase {
  DType grad_type, param16_type;
  bool has_param16, decoupled;
  bool scaled;  // loss scale 1024 and clip coefficient 0.37 applied to the gradient first
};

std::vector<AdamCase> adam_cases() {
  std::vector<AdamCase> c;
  for (DType g : {DType::fp32, DType::fp16, DType::bf16})
    for (int p16 : {0, 1, 2})
      for (bool decoupled : {false, true})
        c.push_back({g, p16 == 2 ? DType::fp16 : DType::bf16, p16 != 0, decoupled, g == DType::fp32 || decoupled});
  return c;
}
constexpr double kLossScale = 1024, kClip = 0.37;

// The state after `steps` adam_update calls on a backend, learning rate changing every step.
struct AdamState {
  std::vector<float> param, exp_avg, exp_avg_sq;
  std::vector<std::uint16_t> param16;
};
constexpr std::size_t kAdamN = 5003;  // not a multiple of any vector width
double adam_lr(long step) { return 1e-2 / double(step); }
constexpr double kWeightDecay = 0.05;

AdamState adam_start(const AdamCase& c) {
  AdamState s{randn(kAdamN, 90), randn(kAdamN, 91, 0.1f), randn(kAdamN, 92, 0.01f), {}};
  for (float& v : s.exp_avg_sq) v = std::fabs(v);
  s.exp_avg_sq[0] = 0;  // a fresh state's first element
  if (c.has_param16) s.param16.assign(kAdamN, 0);
  return s;
}
std::vector<std::uint16_t> adam_grad16(const AdamCase& c, const std::vector<float>& g) {
  if (c.grad_type == DType::fp32) return {};
  return cpu_adam_convert(g, c.grad_type, memwall::adam::Isa::scalar);
}

AdamState run_adam_update(Backend& b, const AdamCase& c, int steps) {
  const AdamState s = adam_start(c);
  std::vector<float> g = randn(kAdamN, 93, 0.5f);
  g[1] = 0;
  const std::vector<std::uint16_t> g16 = adam_grad16(c, g);
  Arena a(b);
  DeviceAdam d;
  d.param = a.up(s.param);
  d.exp_avg = a.up(s.exp_avg);
  d.exp_avg_sq = a.up(s.exp_avg_sq);
  d.grad = c.grad_type == DType::fp32 ? static_cast<const void*>(a.up(g)) : a.up(g16);
  d.grad_type = c.grad_type;
  d.param16 = c.has_param16 ? a.up(s.param16) : nullptr;
  d.param16_type = c.param16_type;
  d.n = kAdamN;
  d.weight_decay = kWeightDecay;
  d.decoupled_weight_decay = c.decoupled;
  d.loss_scale = c.scaled ? kLossScale : 1.0;
  d.clip_coef = c.scaled ? kClip : 1.0;
  for (long step = 1; step <= steps; ++step) {
    d.step = step;
    d.lr = adam_lr(step);
    a.k().adam_update(a.cx(), d);
  }
  AdamState out{a.down(d.param, kAdamN), a.down(d.exp_avg, kAdamN), a.down(d.exp_avg_sq, kAdamN), {}};
  if (c.has_param16) out.param16 = a.down(static_cast<const std::uint16_t*>(d.param16), kAdamN);
  return out;
}

std::string adam_case_name(const AdamCase& c) {
  return std::string("grad ") + std::string(memwall::adam::dtype_name(c.grad_type)) + ", copy " +
         (c.has_param16 ? std::string(memwall::adam::dtype_name(c.param16_type)) : "none") +
         (c.decoupled ? ", AdamW" : ", Adam") + (c.scaled ? ", loss scale and clip" : "");
}

TEST(CpuBackend, AdamUpdateIsCpuAdamBitForBit) {
  auto cpu = create_backend("cpu").value();
  for (const AdamCase& c : adam_cases()) {
    SCOPED_TRACE(adam_case_name(c));
    const int steps = 3;
    const AdamState got = run_adam_update(*cpu, c, steps);
    // CpuAdam::step on host copies, a CpuAdam made for each step's options
    AdamState want = adam_start(c);
    std::vector<float> g = randn(kAdamN, 93, 0.5f);
    g[1] = 0;
    const std::vector<std::uint16_t> g16 = adam_grad16(c, g);
    for (long step = 1; step <= steps; ++step) {
      memwall::adam::AdamOptions o;
      o.lr = adam_lr(step);
      o.weight_decay = kWeightDecay;
      o.decoupled_weight_decay = c.decoupled;
      auto adam = memwall::adam::CpuAdam::create(o).value();
      memwall::adam::AdamChunk chunk{want.param.data(), want.exp_avg.data(), want.exp_avg_sq.data(),
                                     c.grad_type == DType::fp32 ? static_cast<const void*>(g.data()) : g16.data(),
                                     c.grad_type, c.has_param16 ? want.param16.data() : nullptr, c.param16_type,
                                     kAdamN};
      ASSERT_TRUE(adam.step(chunk, step, {c.scaled ? kLossScale : 1.0, c.scaled ? kClip : 1.0}).ok());
    }
    ASSERT_EQ(std::memcmp(got.param.data(), want.param.data(), kAdamN * 4), 0);
    ASSERT_EQ(std::memcmp(got.exp_avg.data(), want.exp_avg.data(), kAdamN * 4), 0);
    ASSERT_EQ(std::memcmp(got.exp_avg_sq.data(), want.exp_avg_sq.data(), kAdamN * 4), 0);
    ASSERT_EQ(got.param16, want.param16);
  }
  EXPECT_EQ(cpu->ops().sticky_error(cpu->ctx()), nullptr);
}

// Against the cpu backend (CpuAdam). The cuda kernel spells each rounding with an IEEE intrinsic
// (__fmaf_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn) in CpuAdam's order and is meant to agree bit for
// bit, but only a tolerance is asserted: that agreement rests on the compiler keeping those
// roundings (no fma contraction, no approximate division or square root) on every architecture
// it targets, which this test does not want to pin down. Two fp32 roundings apart is 2^-22 relative:
// 1e-6 of the largest element allows a few; the 16-bit copy then may differ by one unit.
TEST_P(BackendTest, AdamUpdateMatchesTheCpuBackend) {
  OPEN_OR_SKIP(be, ComputeType::fp32);
  ASSERT_TRUE(be->ops().adam_update) << "optional, but both compiled backends have it";
  auto cpu = create_backend("cpu").value();
  for (const AdamCase& c : adam_cases()) {
    SCOPED_TRACE(adam_case_name(c));
    const AdamState want = run_adam_update(*cpu, c, 3), got = run_adam_update(*be, c, 3);
    EXPECT_LE(rel_error(got.param, want.param), 1e-6);
    EXPECT_LE(rel_error(got.exp_avg, want.exp_avg), 1e-6);
    EXPECT_LE(rel_error(got.exp_avg_sq, want.exp_avg_sq), 1e-6);
    ASSERT_EQ(got.param16.size(), want.param16.size());
    for (std::size_t i = 0; i < got.param16.size(); ++i)
      ASSERT_LE(std::abs(int(got.param16[i]) - int(want.param16[i])), 1) << i;
  }
  EXPECT_EQ(be->ops().sticky_error(be->ctx()), nullptr);
}

// Invalid arguments are a sticky error naming the field, and update nothing: a step before the
// first, a loss scale that is not positive, a negative clip coefficient (each on a fresh backend:
// the first error sticks).
TEST_P(BackendTest, AdamUpdateRefusesBadArguments) {
  const std::vector<std::pair<std::function<void(DeviceAdam&)>, std::string>> bad = {
      {[](DeviceAdam& d) { d.step = 0; }, "step"},
      {[](DeviceAdam& d) { d.loss_scale = 0; }, "loss_scale"},
      {[](DeviceAdam& d) { d.clip_coef = -1; }, "clip_coef"}};
  for (const auto& [spoil, field] : bad) {
    OPEN_OR_SKIP(be, ComputeType::fp32);
    Arena a(*be);
    const std::vector<float> p0 = randn(100, 95);
    DeviceAdam d;
    d.param = a.up(p0);
    d.exp_avg = a.up(std::vector<float>(100));
    d.exp_avg_sq = a.up(std::vector<float>(100));
    d.grad = a.up(randn(100, 96));
    d.n = 100;
    spoil(d);
    a.k().adam_update(a.cx(), d);
    be->ops().synchronize(be->ctx());
    ASSERT_NE(be->ops().sticky_error(be->ctx()), nullptr) << field;
    EXPECT_NE(std::string(be->ops().sticky_error(be->ctx())).find(field), std::string::npos)
        << be->ops().sticky_error(be->ctx());
    EXPECT_EQ(a.down(d.param, 100), p0) << field << ": nothing updated";
  }
}

// ---- event_query ----

TEST_P(BackendTest, EventQueryIsTrueOnceTheStreamHasReachedTheEvent) {
  OPEN_OR_SKIP(be, ComputeType::fp32);
  const BackendOps& k = be->ops();
  void* cx = be->ctx();
  Event e = k.event_create(cx);
  EXPECT_TRUE(k.event_query(cx, e)) << "never recorded";
  const std::size_t n = 4 << 20;
  std::vector<float> src(n, 1.0f);
  float* d = alloc_array<float>(*be, n).value();
  Stream s = k.stream_create(cx).value();
  k.copy_h2d_async(cx, s, d, src.data(), n * sizeof(float));
  k.event_record(cx, e, s);
  (void)k.event_query(cx, e);  // either answer, but it must not block
  k.event_synchronize(cx, e);
  EXPECT_TRUE(k.event_query(cx, e));
  k.event_record(cx, e, 0);
  k.synchronize(cx);
  EXPECT_TRUE(k.event_query(cx, e));
  k.event_destroy(cx, e);
  k.free(cx, d);
  EXPECT_EQ(k.sticky_error ? k.sticky_error(cx) : nullptr, nullptr);
}

TEST(CpuBackend, EventQueryIsFalseWhileTheStreamIsHeld) {
  auto cpu = create_backend("cpu").value();
  const BackendOps& k = cpu->ops();
  void* cx = cpu->ctx();
  Stream s = k.stream_create(cx).value();
  Event e = k.event_create(cx);
  for (int round = 0; round < 2; ++round) {  // the second time, e has been reached once before
    std::promise<void> gate;
    std::shared_future<void> open = gate.get_future().share();
    struct Release {  // lets the stream go however the test ends
      std::promise<void>& p;
      bool done = false;
      void operator()() {
        if (!done) p.set_value();
        done = true;
      }
      ~Release() { (*this)(); }
    } release{gate};
    cpu_stream_enqueue_for_test(*cpu, s, [open] { open.wait(); });
    k.event_record(cx, e, s);
    EXPECT_FALSE(k.event_query(cx, e)) << "round " << round;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(k.event_query(cx, e)) << "round " << round << ": still held";
    release();
    k.event_synchronize(cx, e);
    EXPECT_TRUE(k.event_query(cx, e)) << "round " << round;
  }
  k.event_destroy(cx, e);
}

INSTANTIATE_TEST_SUITE_P(Compiled, BackendTest, ::testing::ValuesIn(compiled_backends()),
                         [](const auto& info) { return info.param; });

}  // namespace

// The cpu backend's kernels run on as many OpenMP threads (which OpenBLAS's OpenMP build follows)
// as it was told: at creation, and again after set_host_threads, on the thread that calls them.
TEST(CpuBackend, KernelsUseTheHostThreadsItWasGiven) {
  BackendOptions o;
  o.threads = 1;
  auto cpu = create_backend("cpu", o).value();
  ASSERT_TRUE(cpu->ops().set_host_threads);
  std::vector<float> a(64 * 64, 1.0f), b(64 * 64, 2.0f), c(64 * 64);
  auto gemm = [&] {
    cpu->ops().gemm(cpu->ctx(), false, false, 64, 64, 64, 1.0f, a.data(), 64, 0, b.data(), 64, 0, 0.0f, c.data(), 64,
                    0, 1);
  };
  omp_set_num_threads(5);  // what OpenMP would use otherwise
  gemm();
  EXPECT_EQ(omp_get_max_threads(), 1);
  EXPECT_EQ(c[0], 128.0f);
  cpu->ops().set_host_threads(cpu->ctx(), 3);
  gemm();
  EXPECT_EQ(omp_get_max_threads(), 3);
  cpu->ops().set_host_threads(cpu->ctx(), 0);  // at least one
  gemm();
  EXPECT_EQ(omp_get_max_threads(), 1);
}

// GEMM results do not depend on the host threads: OpenBLAS's own threading splits work by its
// thread count, and some of its kernels then round the sums differently (100 steps of the README's
// run ended at 3.22188 on one thread and 3.15908 on two with OPENBLAS_CORETYPE=Haswell). The cpu
// backend cuts C into tiles fixed by the shape; every thread count must give the same bits, for
// the GPT's shapes and for odd ones, transposed or not, batched or not. CTest runs this also with
// OPENBLAS_CORETYPE=Haswell (gemm_threads_haswell).
TEST(CpuBackend, GemmBitsDoNotDependOnTheHostThreads) {
  struct Shape {
    bool ta, tb;
    int M, N, K, batch;
  };
  const Shape shapes[] = {{false, true, 512, 768, 256, 1},  {false, false, 512, 256, 1024, 1},
                          {true, false, 1024, 256, 512, 1}, {false, true, 513, 300, 77, 3},
                          {true, true, 130, 1030, 200, 2},  {false, false, 64, 64, 64, 8}};
  auto cpu = create_backend("cpu").value();
  for (const Shape& sh : shapes) {
    SCOPED_TRACE("M " + std::to_string(sh.M) + " N " + std::to_string(sh.N) + " K " + std::to_string(sh.K) +
                 " batch " + std::to_string(sh.batch) + (sh.ta ? " A^T" : "") + (sh.tb ? " B^T" : ""));
    const long a_n = long(sh.M) * sh.K, b_n = long(sh.K) * sh.N, c_n = long(sh.M) * sh.N;
    const std::vector<float> a = randn(std::size_t(a_n * sh.batch), 7), b = randn(std::size_t(b_n * sh.batch), 8);
    const std::vector<float> c0 = randn(std::size_t(c_n * sh.batch), 9);
    std::vector<std::vector<float>> got;
    for (int threads : {1, 2, 3, 4}) {
      cpu->ops().set_host_threads(cpu->ctx(), threads);
      std::vector<float> c = c0;
      cpu->ops().gemm(cpu->ctx(), sh.ta, sh.tb, sh.M, sh.N, sh.K, 0.5f, a.data(), sh.ta ? sh.M : sh.K, a_n, b.data(),
                      sh.tb ? sh.K : sh.N, b_n, 0.25f, c.data(), sh.N, c_n, sh.batch);
      got.push_back(std::move(c));
    }
    for (std::size_t i = 1; i < got.size(); ++i)
      EXPECT_EQ(std::memcmp(got[i].data(), got[0].data(), got[0].size() * sizeof(float)), 0) << i + 1 << " threads";
  }
}

// cuBLAS is not linked but loaded when a cuda backend is made: a process that makes none (memwall
// plan, simulate, --help; this test until it asks) never maps it, and asking finds every entry
// point the backend calls in the cuBLAS of the toolkit it was built with, no GPU needed.
TEST(CudaBackend, LoadsCublasOnlyWhenAsked) {
  auto mapped = [] {
    std::FILE* f = std::fopen("/proc/self/maps", "r");
    if (!f) return std::string("cannot read /proc/self/maps");
    std::string maps;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) maps.append(buf, n);
    std::fclose(f);
    return maps;
  };
  const std::vector<std::string> compiled = memwall::exec::compiled_backends();
  if (std::find(compiled.begin(), compiled.end(), "cuda") == compiled.end()) {
    EXPECT_EQ(memwall::exec::cuda_libraries_error(), "");
    return;
  }
  EXPECT_EQ(mapped().find("libcublas"), std::string::npos) << "cuBLAS is loaded at start-up";
  EXPECT_EQ(memwall::exec::cuda_libraries_error(), "");
  EXPECT_NE(mapped().find("libcublas.so"), std::string::npos) << "asking did not load cuBLAS";
}
