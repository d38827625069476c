// The cpu backend: the "device" is host memory behind an allocator with a hard capacity (an
// allocation over it fails as cudaMalloc would), OpenBLAS sgemm, fp32 kernels parallelised with
// OpenMP, one worker thread per copy stream so copies really run beside compute, and CpuAdam
// (exec/adam) for adam_update.
// Its kernels are the reference every other backend is tested against (tests/exec/backend).
// Every kernel writes each output element from one thread in a fixed order: results do not
// depend on the thread count, so a fixed seed gives the same losses run to run.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "exec/adam/cpu_adam.hpp"
#include "exec/adam/host_cores.hpp"
#include "exec/backend/backend.hpp"
#include "exec/backend/half.hpp"
#include "model/units.hpp"

namespace memwall::exec {
namespace {

constexpr float kLnEps = 1e-5f;
// Loops with less work than this (multiply-adds, roughly) run on one thread: for a small model,
// waking OpenMP's team beside OpenBLAS's threads costs more than the loop (measured: 100x slower
// steps on 2 shared cores when every loop forked).
constexpr long kParallelWork = 1L << 20;

// One copy stream: a thread running queued tasks in order.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [this] { return tasks_.empty() && !busy_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
      lock.unlock();
      task();
      lock.lock();
      busy_ = false;
      if (tasks_.empty()) idle_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false, busy_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

// An event: a generation counter; record() bumps `recorded`, the stream bumps `reached`.
struct CpuEvent {
  std::mutex mu;
  std::condition_variable cv;
  long recorded = 0, reached = 0;
  void wait_for(long gen) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return reached >= gen; });
  }
  void reach(long gen) {
    {
      std::lock_guard<std::mutex> lock(mu);
      reached = std::max(reached, gen);
    }
    cv.notify_all();
  }
};

struct CpuCtx {
  std::size_t capacity_bytes = 0;
  std::size_t used = 0;
  std::mutex mu;
  std::unordered_map<void*, std::size_t> sizes;
  std::vector<std::unique_ptr<Worker>> streams;  // streams[i] is stream i+1
  std::optional<adam::CpuAdam> adam;             // adam_update's, made for the last options seen
  std::string error;                             // sticky_error: the first failure
  std::atomic<int> threads{1};                   // set_host_threads: OpenMP, OpenBLAS and adam_update
};

CpuCtx& C_(void* ctx) { return *static_cast<CpuCtx*>(ctx); }

// OpenMP's thread count is per calling thread (its nthreads ICV), and OpenBLAS's OpenMP build
// follows omp_get_max_threads() on every call: each kernel sets it on the thread that calls it
// when the backend's count changed.
template <auto Kernel>
struct Threaded;
template <typename... A, void (*Kernel)(void*, A...)>
struct Threaded<Kernel> {
  static void call(void* ctx, A... a) {
    const int want = C_(ctx).threads.load(std::memory_order_relaxed);
    if (omp_get_max_threads() != want) omp_set_num_threads(want);
    Kernel(ctx, a...);
  }
};

void cpu_set_host_threads(void* ctx, int n) {
  C_(ctx).threads.store(std::max(1, n), std::memory_order_relaxed);
}

void record_error(CpuCtx& c, const std::string& what) {
  std::fprintf(stderr, "memwall cpu backend: %s\n", what.c_str());
  if (c.error.empty()) c.error = what;
}

Result<void*> cpu_alloc(void* ctx, std::size_t bytes) {
  CpuCtx& c = C_(ctx);
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.used + bytes > c.capacity_bytes)
    return make_error("out of memory on the cpu device: " + format_bytes(double(bytes)) + " requested, " +
                      format_bytes(double(c.used)) + " of " + format_bytes(double(c.capacity_bytes)) + " in use");
  std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);  // the contract: 256-byte aligned, as cudaMalloc
  if (!p) return make_error("out of host memory allocating " + format_bytes(double(bytes)));
  c.sizes[p] = bytes;
  c.used += bytes;
  return p;
}

void cpu_free(void* ctx, void* ptr) {
  if (!ptr) return;
  CpuCtx& c = C_(ctx);
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.sizes.find(ptr);
  if (it == c.sizes.end()) return;
  c.used -= it->second;
  c.sizes.erase(it);
  std::free(ptr);
}

std::size_t cpu_used(void* ctx) {
  CpuCtx& c = C_(ctx);
  std::lock_guard<std::mutex> lock(c.mu);
  return c.used;
}

void cpu_memset_zero(void*, void* ptr, std::size_t bytes) { std::memset(ptr, 0, bytes); }

Result<Stream> cpu_stream_create(void* ctx) {
  CpuCtx& c = C_(ctx);
  c.streams.push_back(std::make_unique<Worker>());
  return Stream(c.streams.size());
}

// Stream 0 is the caller's thread (kernels are synchronous), so work on it runs at once.
void on_stream(void* ctx, Stream s, std::function<void()> task) {
  if (s == 0) return task();
  C_(ctx).streams.at(std::size_t(s) - 1)->push(std::move(task));
}

void cpu_copy(void* ctx, Stream s, void* dst, const void* src, std::size_t bytes) {
  on_stream(ctx, s, [=] { std::memcpy(dst, src, bytes); });
}

Event cpu_event_create(void*) { return new CpuEvent; }
void cpu_event_destroy(void*, Event e) { delete static_cast<CpuEvent*>(e); }
void cpu_event_record(void* ctx, Event e, Stream s) {
  auto* ev = static_cast<CpuEvent*>(e);
  long gen;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    gen = ++ev->recorded;
  }
  on_stream(ctx, s, [ev, gen] { ev->reach(gen); });
}
bool cpu_event_query(void*, Event e) {
  auto* ev = static_cast<CpuEvent*>(e);
  std::lock_guard<std::mutex> lock(ev->mu);
  return ev->reached >= ev->recorded;
}
void cpu_event_synchronize(void*, Event e) {
  auto* ev = static_cast<CpuEvent*>(e);
  long gen;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    gen = ev->recorded;
  }
  ev->wait_for(gen);
}
void cpu_stream_wait_event(void* ctx, Stream s, Event e) {
  auto* ev = static_cast<CpuEvent*>(e);
  long gen;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    gen = ev->recorded;
  }
  on_stream(ctx, s, [ev, gen] { ev->wait_for(gen); });
}
void cpu_synchronize(void* ctx) {
  for (auto& w : C_(ctx).streams) w->drain();
}

// GEMMs whose results do not depend on the thread count. OpenBLAS's own threading splits the work
// by the threads it has, and with some kernels that changes the sums' rounding (measured: 100 steps
// of exec/data/run.yaml with OPENBLAS_CORETYPE=Haswell end at loss 3.22188 on one thread and
// 3.15908 on two), so a run's losses would depend on how busy the machine was. Here each batch
// element's C is cut into a grid of tiles fixed by the shape alone (at most 8 x 8, edges of at
// least 64), and each tile is one single-threaded cblas_sgemm over the whole K: the same calls on
// the same numbers whichever thread runs them, and however many there are.
struct GemmGrid {
  int tile_m, tile_n, tiles_m, tiles_n;
};
GemmGrid gemm_grid(int M, int N) {
  auto edge = [](int n) { return std::max(128, (n / 4 + 15) / 16 * 16); };
  GemmGrid g{edge(M), edge(N), 0, 0};
  g.tiles_m = (M + g.tile_m - 1) / g.tile_m;
  g.tiles_n = (N + g.tile_n - 1) / g.tile_n;
  return g;
}

void cpu_gemm(void*, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, long sa,
              const float* B, int ldb, long sb, float beta, float* C, int ldc, long sc, int batch) {
  const GemmGrid g = gemm_grid(M, N);
  const long per_batch = long(g.tiles_m) * g.tiles_n, units = per_batch * batch;
  auto tile = [&](long u) {
    const long b = u / per_batch;
    const int i = int(u % per_batch / g.tiles_n) * g.tile_m, j = int(u % g.tiles_n) * g.tile_n;
    const int m = std::min(g.tile_m, M - i), n = std::min(g.tile_n, N - j);
    // op(A) rows i.., op(B) columns j..: A (M,K) is rows of A, or columns of A^T (K,M); B likewise
    const float* a = A + b * sa + (ta ? i : long(i) * lda);
    const float* bb = B + b * sb + (tb ? long(j) * ldb : j);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, K, alpha, a,
                lda, bb, ldb, beta, C + b * sc + long(i) * ldc + j, ldc);
  };
  if (units > 1 && double(M) * N * K * batch >= double(kParallelWork)) {
    // inside the team OpenBLAS runs each call on its calling thread (omp_in_parallel)
#pragma omp parallel for schedule(dynamic, 1)
    for (long u = 0; u < units; ++u) tile(u);
    return;
  }
  // one thread: OpenBLAS must not thread this call itself (it follows omp_get_max_threads())
  const int threads = omp_get_max_threads();
  if (threads != 1) omp_set_num_threads(1);
  for (long u = 0; u < units; ++u) tile(u);
  if (threads != 1) omp_set_num_threads(threads);
}

void cpu_encoder_forward(void*, float* out, const int* tokens, const float* wte, const float* wpe, int B, int T,
                         int C) {
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (no wpe: rotary positions)
#pragma omp parallel for if(long(B) * T * C >= kParallelWork)
  for (int bt = 0; bt < B * T; ++bt) {
    const float* e = wte + long(tokens[bt]) * C;
    float* o = out + long(bt) * C;
    if (!wpe) {
      std::memcpy(o, e, std::size_t(C) * sizeof(float));
      continue;
    }
    const float* p = wpe + long(bt % T) * C;
    for (int i = 0; i < C; ++i) o[i] = e[i] + p[i];
  }
}

void cpu_encoder_backward(void*, float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C) {
  // Serial over positions: tokens repeat, and a fixed order keeps the sum deterministic.
  for (int bt = 0; bt < B * T; ++bt) {
    float* de = dwte + long(tokens[bt]) * C;
    const float* d = dout + long(bt) * C;
    for (int i = 0; i < C; ++i) de[i] += d[i];
    if (!dwpe) continue;
    float* dp = dwpe + long(bt % T) * C;
    for (int i = 0; i < C; ++i) dp[i] += d[i];
  }
}

void cpu_layernorm_forward(void*, float* out, float* mean, float* rstd, const float* inp, const float* w,
                           const float* bias, int BT, int C) {
#pragma omp parallel for if(long(BT) * C >= kParallelWork)
  for (int r = 0; r < BT; ++r) {
    const float* x = inp + long(r) * C;
    float m = 0;
    for (int i = 0; i < C; ++i) m += x[i];
    m /= float(C);
    float v = 0;
    for (int i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v /= float(C);
    const float s = 1.0f / std::sqrt(v + kLnEps);
    float* o = out + long(r) * C;
    for (int i = 0; i < C; ++i) o[i] = (s * (x[i] - m)) * w[i] + bias[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

void cpu_layernorm_backward(void*, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                            const float* w, const float* mean, const float* rstd, int BT, int C) {
  // forward: out = norm * w + b, norm = (x - mean) * rstd
  // dnorm = dout * w; dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
#pragma omp parallel for if(long(BT) * C >= kParallelWork)
  for (int r = 0; r < BT; ++r) {
    const float* x = inp + long(r) * C;
    const float* d = dout + long(r) * C;
    float dn_mean = 0, dn_norm_mean = 0;
    for (int i = 0; i < C; ++i) {
      const float n = (x[i] - mean[r]) * rstd[r];
      const float dn = w[i] * d[i];
      dn_mean += dn;
      dn_norm_mean += dn * n;
    }
    dn_mean /= float(C);
    dn_norm_mean /= float(C);
    float* dx = dinp + long(r) * C;
    for (int i = 0; i < C; ++i) {
      const float n = (x[i] - mean[r]) * rstd[r];
      dx[i] += (w[i] * d[i] - dn_mean - n * dn_norm_mean) * rstd[r];
    }
  }
  // dw += sum over rows of dout * norm; db += sum of dout (per column, rows in order)
#pragma omp parallel for if(long(BT) * C >= kParallelWork)
  for (int i = 0; i < C; ++i) {
    float sw = 0, sb = 0;
    for (int r = 0; r < BT; ++r) {
      const float dd = dout[long(r) * C + i];
      sw += dd * (inp[long(r) * C + i] - mean[r]) * rstd[r];
      sb += dd;
    }
    dw[i] += sw;
    db[i] += sb;
  }
}

void cpu_rmsnorm_forward(void*, float* out, float* rstd, const float* inp, const float* w, int BT, int C) {
#pragma omp parallel for if(long(BT) * C >= kParallelWork)
  for (int r = 0; r < BT; ++r) {
    const float* x = inp + long(r) * C;
    float ss = 0;
    for (int i = 0; i < C; ++i) ss += x[i] * x[i];
    const float s = 1.0f / std::sqrt(ss / float(C) + kLnEps);
    float* o = out + long(r) * C;
    for (int i = 0; i < C; ++i) o[i] = (x[i] * s) * w[i];
    rstd[r] = s;
  }
}

void cpu_rmsnorm_backward(void*, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                          const float* rstd, int BT, int C) {
  // forward: out = n * w, n = x * rstd, rstd = (mean(x^2) + eps)^-1/2
  // dn = dout * w; dx = rstd * (dn - n * mean(dn * n))
#pragma omp parallel for if(long(BT) * C >= kParallelWork)
  for (int r = 0; r < BT; ++r) {
    const float* x = inp + long(r) * C;
    const float* d = dout + long(r) * C;
    float dn_norm_mean = 0;
    for (int i = 0; i < C; ++i) dn_norm_mean += w[i] * d[i] * (x[i] * rstd[r]);
    dn_norm_mean /= float(C);
    float* dx = dinp + long(r) * C;
    for (int i = 0; i < C; ++i) dx[i] += (w[i] * d[i] - (x[i] * rstd[r]) * dn_norm_mean) * rstd[r];
  }
  // dw += sum over rows of dout * n (per column, rows in order)
#pragma omp parallel for if(long(BT) * C >= kParallelWork)
  for (int i = 0; i < C; ++i) {
    float sw = 0;
    for (int r = 0; r < BT; ++r) sw += dout[long(r) * C + i] * (inp[long(r) * C + i] * rstd[r]);
    dw[i] += sw;
  }
}

// The angle of channel pair i at position t: t * theta^(-2i/hs), in double and rounded once, so
// every backend turns by the same float cosine and sine.
void rope_angles(int t, int i, int hs, float theta, float& c, float& s) {
  const double a = double(t) * std::pow(double(theta), -2.0 * i / hs);
  c = float(std::cos(a));
  s = float(std::sin(a));
}

void cpu_rope(void*, float* qkv, int B, int T, int C, int NH, int KVH, float theta, bool inverse) {
  const int hs = C / NH, half_hs = hs / 2, W = C + 2 * KVH * hs, heads = NH + KVH;  // q heads, then k heads
#pragma omp parallel for if(long(B) * T * (C + KVH * hs) * 4 >= kParallelWork)
  for (int bt = 0; bt < B * T; ++bt) {
    const int t = bt % T;
    for (int i = 0; i < half_hs; ++i) {
      float c, sn;
      rope_angles(t, i, hs, theta, c, sn);
      if (inverse) sn = -sn;
      for (int h = 0; h < heads; ++h) {
        float* x = qkv + long(bt) * W + long(h) * hs;
        const float x1 = x[i], x2 = x[i + half_hs];
        x[i] = x1 * c - x2 * sn;
        x[i + half_hs] = x2 * c + x1 * sn;
      }
    }
  }
}

void cpu_bias_forward(void*, float* out, const float* bias, int BT, int OC, int ldo) {
  // out[r * ldo + o] += bias[o]: OC columns of a (BT, ldo) output
#pragma omp parallel for if(long(BT) * OC >= kParallelWork)
  for (int r = 0; r < BT; ++r)
    for (int o = 0; o < OC; ++o) out[long(r) * ldo + o] += bias[o];
}

void cpu_bias_backward(void*, float* dbias, const float* dout, int BT, int OC, int ldd) {
  // forward: out[r * ldo + o] += bias[o]; dbias[o] += sum over rows, in row order
  std::vector<float> s(std::size_t(OC), 0.0f);
  for (int r = 0; r < BT; ++r)
    for (int o = 0; o < OC; ++o) s[std::size_t(o)] += dout[long(r) * ldd + o];
  for (int o = 0; o < OC; ++o) dbias[o] += s[std::size_t(o)];
}

// Attention. q, k, v: qkv[b, t, 0:C], [C:C+KVH*hs], [C+KVH*hs:QW], query head h at channels
// h*hs .. (h+1)*hs of q, its key/value head h / (NH/KVH) at the same place of k and v.
// The two backward kernels together do what one fused kernel would, in the same order of
// operations, so their composition rounds exactly as llm.c's attention_backward does (KVH = NH).
struct AttnShape {
  int T, C, NH, KVH, hs, group, W;  // group: query heads per key/value head; W: a qkv row
  AttnShape(int T_, int C_, int NH_, int KVH_)
      : T(T_), C(C_), NH(NH_), KVH(KVH_), hs(C_ / NH_), group(NH_ / KVH_), W(C_ + 2 * KVH_ * (C_ / NH_)) {}
  long row(int b, int t) const { return (long(b) * T + t) * W; }
  long q(int b, int t, int h) const { return row(b, t) + long(h) * hs; }
  long k(int b, int t, int h) const { return row(b, t) + C + long(h / group) * hs; }
  long v(int b, int t, int h) const { return row(b, t) + C + long(KVH) * hs + long(h / group) * hs; }
  long att(int b, int h, int t) const { return ((long(b) * NH + h) * T + t) * T; }
};

void cpu_attention_scores_forward(void*, float* att, const float* qkv, int B, int T, int C, int NH, int KVH) {
  // att[b,h,t,:] = softmax over t2 <= t of scale * q[b,t,h] . k[b,t2,h]; zero for t2 > t
  const AttnShape s(T, C, NH, KVH);
  const float scale = 1.0f / std::sqrt(float(s.hs));
#pragma omp parallel for collapse(3) if(long(B) * NH * T * T * s.hs >= kParallelWork)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* q = qkv + s.q(b, t, h);
        float* a = att + s.att(b, h, t);
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + s.k(b, t2, h);
          float dot = 0;
          for (int i = 0; i < s.hs; ++i) dot += q[i] * k[i];
          a[t2] = dot * scale;
          maxv = std::max(maxv, a[t2]);
        }
        float sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(a[t2] - maxv);
          sum += a[t2];
        }
        const float inv = 1.0f / sum;
        for (int t2 = 0; t2 < T; ++t2) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
      }
}

void cpu_attention_context_forward(void*, float* out, const float* att, const float* qkv, int B, int T, int C, int NH,
                                   int KVH) {
  // out[b,t,h] = sum over t2 <= t of att[b,h,t,t2] * v[b,t2,h]
  const AttnShape s(T, C, NH, KVH);
#pragma omp parallel for collapse(3) if(long(B) * NH * T * T * s.hs >= kParallelWork)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* a = att + s.att(b, h, t);
        float* o = out + (long(b) * T + t) * C + h * s.hs;
        for (int i = 0; i < s.hs; ++i) o[i] = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + s.v(b, t2, h);
          for (int i = 0; i < s.hs; ++i) o[i] += a[t2] * v[i];
        }
      }
}

void cpu_attention_context_backward(void*, float* datt, float* dqkv, const float* dout, const float* att,
                                    const float* qkv, int B, int T, int C, int NH, int KVH) {
  const AttnShape s(T, C, NH, KVH);
  // One (b, key/value head) per iteration: the rows t of its query heads add into dv of every
  // t2 <= t, so heads and t stay serial (in head order: the sums' order is fixed).
#pragma omp parallel for collapse(2) if(long(B) * NH * T * T * s.hs >= kParallelWork)
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < KVH; ++g)
      for (int h = g * s.group; h < (g + 1) * s.group; ++h)
        for (int t = 0; t < T; ++t) {
          const float* a = att + s.att(b, h, t);
          float* da = datt + s.att(b, h, t);
          const float* d = dout + (long(b) * T + t) * C + h * s.hs;
          // forward: o[i] += a[t2] * v[t2][i]
          for (int t2 = 0; t2 <= t; ++t2) {
            const float* v = qkv + s.v(b, t2, h);
            float* dv = dqkv + s.v(b, t2, h);
            float dot = 0;
            for (int i = 0; i < s.hs; ++i) {
              dot += v[i] * d[i];
              dv[i] += a[t2] * d[i];
            }
            da[t2] += dot;
          }
        }
}

void cpu_attention_scores_backward(void*, float* dqkv, float* datt, const float* att, const float* qkv, int B,
                                   int T, int C, int NH, int KVH) {
  const AttnShape s(T, C, NH, KVH);
  const float scale = 1.0f / std::sqrt(float(s.hs));
  // One (b, key/value head) per iteration: the rows t of its query heads add into dk of every
  // t2 <= t, so heads and t stay serial.
#pragma omp parallel for collapse(2) if(long(B) * NH * T * T * s.hs >= kParallelWork)
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < KVH; ++g)
      for (int h = g * s.group; h < (g + 1) * s.group; ++h)
        for (int t = 0; t < T; ++t) {
          const float* a = att + s.att(b, h, t);
          const float* da = datt + s.att(b, h, t);
          // forward: a = softmax(pre); dpre[t2] = a[t2] * (da[t2] - sum_t3 a[t3] da[t3])
          float dot = 0;
          for (int t2 = 0; t2 <= t; ++t2) dot += a[t2] * da[t2];
          // forward: pre[t2] = scale * q . k[t2]
          const float* q = qkv + s.q(b, t, h);
          float* dq = dqkv + s.q(b, t, h);
          for (int t2 = 0; t2 <= t; ++t2) {
            const float* k = qkv + s.k(b, t2, h);
            float* dk = dqkv + s.k(b, t2, h);
            const float dpre = a[t2] * (da[t2] - dot);
            const float gs = dpre * scale;
            for (int i = 0; i < s.hs; ++i) {
              dq[i] += gs * k[i];
              dk[i] += gs * q[i];
            }
          }
        }
}

// GeLU, tanh approximation (torch's approximate="tanh", GPT-2's)
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2 / pi)

// A gated feed-forward's activation: out = act(gate) * up; act SiLU, x * sigmoid(x), or GeLU
float silu(float x) { return x / (1.0f + std::exp(-x)); }
float silu_grad(float x) {  // d/dx x * sig(x) = sig(x) * (1 + x * (1 - sig(x)))
  const float sg = 1.0f / (1.0f + std::exp(-x));
  return sg * (1.0f + x * (1.0f - sg));
}
float gelu(float x) { return 0.5f * x * (1.0f + std::tanh(kGeluS * (x + 0.044715f * x * x * x))); }
float gelu_grad(float x) {
  const float th = std::tanh(kGeluS * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluS * (1.0f + 3.0f * 0.044715f * x * x);
}

void cpu_gelu_forward(void*, float* out, const float* inp, long N) {
#pragma omp parallel for if(N * 8 >= kParallelWork)
  for (long i = 0; i < N; ++i) out[i] = gelu(inp[i]);
}

void cpu_gelu_backward(void*, float* dinp, const float* inp, const float* dout, long N) {
#pragma omp parallel for if(N * 8 >= kParallelWork)
  for (long i = 0; i < N; ++i) dinp[i] += gelu_grad(inp[i]) * dout[i];
}

void cpu_glu_forward(void*, float* out, const float* inp, long BT, int I, bool use_gelu) {
#pragma omp parallel for if(BT * I * 8 >= kParallelWork)
  for (long r = 0; r < BT; ++r) {
    const float* g = inp + r * 2 * I;
    const float* u = g + I;
    float* o = out + r * I;
    for (int i = 0; i < I; ++i) o[i] = (use_gelu ? gelu(g[i]) : silu(g[i])) * u[i];
  }
}

void cpu_glu_backward(void*, float* dinp, const float* inp, const float* dout, long BT, int I, bool use_gelu) {
  // forward: o = act(g) * u: dg = d * act'(g) * u, du = d * act(g)
#pragma omp parallel for if(BT * I * 8 >= kParallelWork)
  for (long r = 0; r < BT; ++r) {
    const float* g = inp + r * 2 * I;
    const float* u = g + I;
    const float* d = dout + r * I;
    float* dg = dinp + r * 2 * I;
    float* du = dg + I;
    for (int i = 0; i < I; ++i) {
      dg[i] += d[i] * (use_gelu ? gelu_grad(g[i]) : silu_grad(g[i])) * u[i];
      du[i] += d[i] * (use_gelu ? gelu(g[i]) : silu(g[i]));
    }
  }
}

void cpu_residual_forward(void*, float* out, const float* a, const float* b, long N) {
#pragma omp parallel for if(N >= kParallelWork)
  for (long i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

void cpu_accumulate(void*, float* dst, const float* src, long N) {
#pragma omp parallel for if(N >= kParallelWork)
  for (long i = 0; i < N; ++i) dst[i] += src[i];
}

void cpu_crossentropy_forward(void*, float* probs, float* losses, const float* logits, const int* targets, int BT,
                              int V) {
#pragma omp parallel for if(long(BT) * V * 4 >= kParallelWork)
  for (int r = 0; r < BT; ++r) {
    const float* l = logits + long(r) * V;
    float* p = probs + long(r) * V;
    float maxv = -INFINITY;
    for (int i = 0; i < V; ++i) maxv = std::max(maxv, l[i]);
    float sum = 0;
    for (int i = 0; i < V; ++i) {
      p[i] = std::exp(l[i] - maxv);
      sum += p[i];
    }
    for (int i = 0; i < V; ++i) p[i] /= sum;
    // -log softmax computed from the logits, not log(p), so a tiny p does not lose precision
    losses[r] = -(l[targets[r]] - maxv - std::log(sum));
  }
}

void cpu_crossentropy_backward(void*, float* dlogits, const float* probs, const int* targets, float dloss, int BT,
                               int V) {
#pragma omp parallel for if(long(BT) * V >= kParallelWork)
  for (int r = 0; r < BT; ++r)
    for (int i = 0; i < V; ++i)
      dlogits[long(r) * V + i] += (probs[long(r) * V + i] - (i == targets[r] ? 1.0f : 0.0f)) * dloss;
}

// 16-bit conversions, one element per iteration (exec/backend/half.hpp rounds)

void cpu_to_fp32(void*, float* dst, const void* src, adam::DType t, long n) {
  if (n <= 0) return;
  if (t == adam::DType::fp32) return void(std::memcpy(dst, src, std::size_t(n) * sizeof(float)));
  const auto* s = static_cast<const std::uint16_t*>(src);
#pragma omp parallel for if(n >= kParallelWork)
  for (long i = 0; i < n; ++i) dst[i] = half::f32_from_half(s[i], t);
}

void cpu_from_fp32(void*, void* dst, const float* src, adam::DType t, long n) {
  if (n <= 0) return;
  if (t == adam::DType::fp32) return void(std::memcpy(dst, src, std::size_t(n) * sizeof(float)));
  auto* d = static_cast<std::uint16_t*>(dst);
#pragma omp parallel for if(n >= kParallelWork)
  for (long i = 0; i < n; ++i) d[i] = half::half_from_f32(src[i], t);
}

void cpu_accumulate_to(void*, void* dst, const float* src, adam::DType t, long n) {
  if (t == adam::DType::fp32) {
    float* d = static_cast<float*>(dst);
#pragma omp parallel for if(n >= kParallelWork)
    for (long i = 0; i < n; ++i) d[i] += src[i];
    return;
  }
  auto* d = static_cast<std::uint16_t*>(dst);
#pragma omp parallel for if(n >= kParallelWork)
  for (long i = 0; i < n; ++i) d[i] = half::half_from_f32(half::add_f32(half::f32_from_half(d[i], t), src[i]), t);
}

// Contiguous parts, [p n / parts, (p + 1) n / parts), each summed in order.
void cpu_sum_squares(void*, double* partials, int parts, const void* x, adam::DType t, long n) {
  if (parts < 1) return;
  const std::size_t es = adam::dtype_bytes(t);
#pragma omp parallel for if(n >= kParallelWork)
  for (int p = 0; p < parts; ++p) {
    const long from = long(double(p) * double(n) / parts), to = long(double(p + 1) * double(n) / parts);
    partials[p] = host_sum_squares(static_cast<const char*>(x) + std::size_t(from) * es, t, std::size_t(to - from));
  }
}

// CpuAdam on the pointers (the cpu device is host memory). A CpuAdam is made for one set of
// options and keeps a worker pool: it is made again only when the options change (a learning
// rate schedule: once per step, not once per chunk).
void cpu_adam_update(void* ctx, const DeviceAdam& d) {
  CpuCtx& c = C_(ctx);
  const adam::AdamOptions o{d.lr, d.beta1, d.beta2, d.eps, d.weight_decay, d.decoupled_weight_decay};
  if (c.adam) {
    const adam::AdamOptions& have = c.adam->options();
    if (have.lr != o.lr || have.beta1 != o.beta1 || have.beta2 != o.beta2 || have.eps != o.eps ||
        have.weight_decay != o.weight_decay || have.decoupled_weight_decay != o.decoupled_weight_decay)
      c.adam.reset();
  }
  if (!c.adam) {
    Result<adam::CpuAdam> made = adam::CpuAdam::create(o, c.threads.load(std::memory_order_relaxed));
    if (!made) return record_error(c, "adam_update: " + made.error());
    c.adam.emplace(std::move(made).value());
  }
  const adam::AdamChunk chunk{d.param,   d.exp_avg,      d.exp_avg_sq, d.grad, d.grad_type,
                              d.param16, d.param16_type, d.n};
  c.adam->set_threads_in_use(c.threads.load(std::memory_order_relaxed));
  Result<std::size_t> done = c.adam->step(chunk, d.step, adam::GradScaling{d.loss_scale, d.clip_coef});
  if (!done) record_error(c, "adam_update: " + done.error());
}

const char* cpu_sticky_error(void* ctx) { return C_(ctx).error.empty() ? nullptr : C_(ctx).error.c_str(); }

void cpu_destroy(void* ctx) {
  cpu_synchronize(ctx);
  CpuCtx* c = static_cast<CpuCtx*>(ctx);
  c->streams.clear();
  for (auto& [p, n] : c->sizes) std::free(p);
  delete c;
}

const BackendOps kCpuOps = {
    cpu_alloc,
    cpu_free,
    cpu_used,
    cpu_memset_zero,
    cpu_stream_create,
    cpu_copy,
    cpu_copy,
    cpu_copy,
    cpu_event_create,
    cpu_event_destroy,
    cpu_event_record,
    cpu_event_synchronize,
    cpu_event_query,
    cpu_stream_wait_event,
    cpu_synchronize,
    nullptr,  // host_register: host memory is already the device's
    nullptr,
    Threaded<cpu_gemm>::call,
    Threaded<cpu_encoder_forward>::call,
    Threaded<cpu_encoder_backward>::call,
    Threaded<cpu_layernorm_forward>::call,
    Threaded<cpu_layernorm_backward>::call,
    Threaded<cpu_rmsnorm_forward>::call,
    Threaded<cpu_rmsnorm_backward>::call,
    Threaded<cpu_rope>::call,
    Threaded<cpu_bias_forward>::call,
    Threaded<cpu_bias_backward>::call,
    Threaded<cpu_attention_scores_forward>::call,
    Threaded<cpu_attention_context_forward>::call,
    Threaded<cpu_attention_context_backward>::call,
    Threaded<cpu_attention_scores_backward>::call,
    Threaded<cpu_gelu_forward>::call,
    Threaded<cpu_gelu_backward>::call,
    Threaded<cpu_glu_forward>::call,
    Threaded<cpu_glu_backward>::call,
    Threaded<cpu_residual_forward>::call,
    Threaded<cpu_accumulate>::call,
    Threaded<cpu_crossentropy_forward>::call,
    Threaded<cpu_crossentropy_backward>::call,
    Threaded<cpu_to_fp32>::call,
    Threaded<cpu_from_fp32>::call,
    Threaded<cpu_accumulate_to>::call,
    cpu_adam_update,
    Threaded<cpu_sum_squares>::call,
    cpu_sticky_error,  // every cpu kernel has finished when its call returns: only refusals
    nullptr,  // native_stream: copy streams are memwall's own threads
    cpu_set_host_threads,
    cpu_destroy,
};

}  // namespace

// Test hook, declared by tests/exec/backend only: queues a host task on copy stream s (>= 1) of a
// cpu backend, so a test can hold a stream (and the events behind it) until it lets go.
void cpu_stream_enqueue_for_test(Backend& cpu, Stream s, std::function<void()> task) {
  if (cpu.caps().name == "cpu" && s >= 1) on_stream(cpu.ctx(), s, std::move(task));
}

Result<std::unique_ptr<Backend>> create_cpu_backend(const BackendOptions& o) {
  if (o.compute != ComputeType::fp32)
    return make_error(std::string("the cpu backend computes in fp32 only, not ") + compute_type_name(o.compute));
  auto* ctx = new CpuCtx;
  ctx->capacity_bytes = o.capacity_bytes ? o.capacity_bytes : (std::size_t(1) << 30);
  ctx->threads = o.threads > 0 ? o.threads : adam::cores_allowed().quota_cores;
  BackendCaps caps{"cpu", "host memory (OpenBLAS)", ctx->capacity_bytes, 0, true, false, false, ComputeType::fp32};
  return std::make_unique<Backend>(&kCpuOps, ctx, std::move(caps));
}

}  // namespace memwall::exec
