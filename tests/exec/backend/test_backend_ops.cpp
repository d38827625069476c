// Every kernel on every compiled backend against the cpu backend (ggml's test-backend-ops idea),
// plus each backend's capacity limit and asynchronous copies with events. A compiled backend whose
// device is absent (cuda on a machine without a GPU) is skipped with that reason and only then.
// Tolerance: max |x - ref| / max |ref| per output, 1e-5 for fp32 compute; GEMMs computed in
// fp16 / bf16 (fp32 accumulation) 2e-3 / 1.6e-2 (a few units of the format's rounding, 2^-11 / 2^-8).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "exec/backend/backend.hpp"

using namespace memwall::exec;

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
  std::vector<float> down(const float* d, std::size_t n) {
    std::vector<float> h(n);
    b_.ops().copy_d2h_async(b_.ctx(), 0, h.data(), d, n * sizeof(float));
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

using Outputs = std::vector<std::vector<float>>;
struct OpCase {
  std::string name;
  std::function<Outputs(Arena&)> run;
  bool gemm = false;  // its tolerance follows the backend's compute type
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
                   true});
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
                 a.k().bias_forward(a.cx(), out, bias, BT, C);
                 a.k().bias_backward(a.cx(), db, a.up(randn(BT * C, 20)), BT, C);
                 return Outputs{a.down(out, BT * C), a.down(db, C)};
               }});
  c.push_back({"attention", [](Arena& a) {
                 auto qkv = a.up(randn(BT * 3 * C, 21, 2.0f));
                 auto out = a.up(std::vector<float>(BT * C)), att = a.up(std::vector<float>(B * NH * T * T));
                 a.k().attention_forward(a.cx(), out, att, qkv, B, T, C, NH);
                 auto dqkv = a.up(randn(BT * 3 * C, 22));
                 a.k().attention_backward(a.cx(), dqkv, a.up(randn(BT * C, 23)), qkv, att, B, T, C, NH);
                 return Outputs{a.down(out, BT * C), a.down(att, B * NH * T * T), a.down(dqkv, BT * 3 * C)};
               }});
  c.push_back({"gelu", [](Arena& a) {
                 const long N = BT * 4 * C;
                 auto x = a.up(randn(std::size_t(N), 24, 4.0f)), out = a.up(std::vector<float>(std::size_t(N)));
                 a.k().gelu_forward(a.cx(), out, x, N);
                 auto dx = a.up(randn(std::size_t(N), 25));
                 a.k().gelu_backward(a.cx(), dx, x, a.up(randn(std::size_t(N), 26)), N);
                 return Outputs{a.down(out, std::size_t(N)), a.down(dx, std::size_t(N))};
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
std::unique_ptr<Backend> open_or_skip(const std::string& name, ComputeType ct, bool& skip, std::string& why) {
  BackendOptions o;
  o.compute = ct;
  o.capacity_bytes = 64 << 20;
  auto b = create_backend(name, o);
  if (!b) {
    if (b.error().rfind("no CUDA device", 0) == 0) {
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
      if (ct != ComputeType::fp32 && !op.gemm) continue;
      const double tol = ct == ComputeType::fp32 ? 1e-5 : ct == ComputeType::fp16 ? 2e-3 : 1.6e-2;
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

TEST_P(BackendTest, AllocationBeyondCapacityFailsLikeOutOfMemory) {
  bool skip = false;
  std::string why;
  auto be = open_or_skip(GetParam(), ComputeType::fp32, skip, why);
  if (skip) GTEST_SKIP() << GetParam() << " backend compiled but not testable here: " << why;
  ASSERT_TRUE(be);
  EXPECT_EQ(be->caps().capacity_bytes, std::size_t(64) << 20);
  auto a = be->ops().alloc(be->ctx(), 40 << 20);
  ASSERT_TRUE(a.ok());
  auto b = be->ops().alloc(be->ctx(), 40 << 20);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().find("out of memory"), std::string::npos) << b.error();
  be->ops().free(be->ctx(), *a);
  EXPECT_EQ(be->ops().used_bytes(be->ctx()), 0u);
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

INSTANTIATE_TEST_SUITE_P(Compiled, BackendTest, ::testing::ValuesIn(compiled_backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
