#include "exec/adam/adam_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#if MEMWALL_ADAM_X86
#include <immintrin.h>
#endif

#include "exec/adam/cpu_adam.hpp"
#include "exec/adam/worker_pool.hpp"
#include "model/units.hpp"

namespace memwall::adam {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, FreeDeleter>;

Buffer allocate(std::size_t bytes) {
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, std::max<std::size_t>(rounded, 64));
  if (!p) throw std::bad_alloc();
  return Buffer(p);
}

// [begin, end) of part t of `parts`, on 64-element boundaries.
std::pair<std::size_t, std::size_t> part(std::size_t n, int parts, int t) {
  const std::size_t blocks = (n + 63) / 64;
  auto edge = [&](int k) { return std::min(n, blocks * static_cast<std::size_t>(k) / parts * 64); };
  return {edge(t), edge(t + 1)};
}

// A cheap deterministic value in [lo, hi): the benchmark needs plausible numbers, not randomness.
float value_at(std::size_t i, std::uint64_t salt, float lo, float hi) {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ salt;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return lo + (hi - lo) * static_cast<float>(x >> 40) * 0x1.0p-24f;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// a[i] = b[i] + s * c[i] with non-temporal stores to a. begin is a multiple of 64 elements and a is
// 64-byte aligned, so a + begin is aligned for every store width used.
void triad_range_portable(float* a, const float* b, const float* c, float s, std::size_t begin, std::size_t end) {
  std::size_t i = begin;
#if MEMWALL_ADAM_X86
  const __m128 vs = _mm_set1_ps(s);  // SSE2 is in every x86-64 CPU
  for (; i + 4 <= end; i += 4)
    _mm_stream_ps(a + i, _mm_add_ps(_mm_loadu_ps(b + i), _mm_mul_ps(vs, _mm_loadu_ps(c + i))));
  _mm_sfence();
#endif
  for (; i < end; ++i) a[i] = b[i] + s * c[i];
}

#if MEMWALL_ADAM_X86
// The same at the width the Adam kernel uses, so the bound is not limited by the triad's own code.
__attribute__((target("avx512f"))) void triad_range_avx512(float* a, const float* b, const float* c, float s,
                                                           std::size_t begin, std::size_t end) {
  std::size_t i = begin;
  const __m512 vs = _mm512_set1_ps(s);
  for (; i + 16 <= end; i += 16)
    _mm512_stream_ps(a + i, _mm512_add_ps(_mm512_loadu_ps(b + i), _mm512_mul_ps(vs, _mm512_loadu_ps(c + i))));
  _mm_sfence();
  for (; i < end; ++i) a[i] = b[i] + s * c[i];
}
#endif

using TriadFn = void (*)(float*, const float*, const float*, float, std::size_t, std::size_t);

TriadFn best_triad() {
#if MEMWALL_ADAM_X86
  if (isa_supported(Isa::avx512)) return triad_range_avx512;
#endif
  return triad_range_portable;
}

}  // namespace

double adam_bytes_per_param(DType grad_dtype, bool writes_param16) {
  const double read = 4 + static_cast<double>(dtype_bytes(grad_dtype)) + 4 + 4;  // param, grad, exp_avg, exp_avg_sq
  const double written = 4 + 4 + 4 + (writes_param16 ? 2 : 0);                   // param, exp_avg, exp_avg_sq, param16
  return read + written;
}

Result<AdamBenchReport> run_adam_bench(const AdamBenchOptions& o) {
  if (o.params < 1) return make_error("params: expected a count >= 1");
  if (o.repeats < 1) return make_error("repeats: expected a count >= 1");
  if (o.param16_dtype == DType::fp32) return make_error("dtype: expected bf16 or fp16, got fp32");

  // torch.optim.Adam's defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, no weight decay), the
  // configuration bench/adam/run.py times torch with; the kernel's speed does not depend on them.
  Result<CpuAdam> made = CpuAdam::create(AdamOptions{}, o.threads, o.isa);
  if (!made) return make_error(made.error());
  CpuAdam adam = std::move(made).value();

  const std::size_t n = o.params;
  const double bytes_per_param = adam_bytes_per_param(o.grad_dtype, true);
  const double need_bytes = static_cast<double>(n) * std::max(bytes_per_param, kTriadBytesPerElem);
  const double have_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (need_bytes > 0.8 * have_bytes)
    return make_error("params: " + format_count(static_cast<double>(n)) + " parameters need " + format_bytes(need_bytes) +
                      " of memory, more than 80 % of this machine's " + format_bytes(have_bytes));
  // Work bound: every repeat streams the whole state (30 B per parameter) once.
  if (double(o.repeats) * double(n) > kMaxParamUpdates)
    return make_error("repeats: " + std::to_string(o.repeats) + " x " + format_count(double(n)) +
                      " params is more than " + format_count(kMaxParamUpdates) + " parameter updates (at most " +
                      std::to_string(std::max(1L, long(kMaxParamUpdates / double(n)))) + " repeats of this size)");

  AdamBenchReport r;
  r.params = n;
  r.param16_dtype = o.param16_dtype;
  r.grad_dtype = o.grad_dtype;
  r.isa = adam.isa();
  r.threads = adam.threads();
  r.repeats = o.repeats;
  r.bytes_per_param = bytes_per_param;
  std::optional<WorkerPool> started;
  try {
    started.emplace(r.threads);
  } catch (const std::system_error& e) {
    return make_error("threads: cannot start " + std::to_string(r.threads) + " threads: " + e.code().message());
  }
  WorkerPool& pool = *started;

  try {
    {  // Triad first, in its own buffers, freed before Adam's are allocated.
      Buffer a = allocate(n * 4), b = allocate(n * 4), c = allocate(n * 4);
      auto* pa = static_cast<float*>(a.get());
      auto* pb = static_cast<float*>(b.get());
      auto* pc = static_cast<float*>(c.get());
      pool.run(r.threads, [&](int t) {  // first touch by the thread that will use the pages
        const auto [lo, hi] = part(n, r.threads, t);
        for (std::size_t i = lo; i < hi; ++i) pa[i] = 0, pb[i] = value_at(i, 1, -1, 1), pc[i] = value_at(i, 2, -1, 1);
      });
      const TriadFn triad = best_triad();
      std::vector<double> times;
      for (int rep = 0; rep <= o.repeats; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        pool.run(r.threads, [&](int t) {
          const auto [lo, hi] = part(n, r.threads, t);
          triad(pa, pb, pc, 3.0f, lo, hi);
        });
        if (rep > 0) times.push_back(seconds_since(t0));
      }
      r.triad_best_s = *std::min_element(times.begin(), times.end());
    }

    const std::size_t gb = dtype_bytes(o.grad_dtype);
    Buffer param = allocate(n * 4), grad = allocate(n * gb), m = allocate(n * 4), v = allocate(n * 4),
           param16 = allocate(n * 2);
    AdamChunk chunk;
    chunk.param = static_cast<float*>(param.get());
    chunk.exp_avg = static_cast<float*>(m.get());
    chunk.exp_avg_sq = static_cast<float*>(v.get());
    chunk.grad = grad.get();
    chunk.grad_dtype = o.grad_dtype;
    chunk.param16 = param16.get();
    chunk.param16_dtype = o.param16_dtype;
    chunk.n = n;
    pool.run(r.threads, [&](int t) {
      const auto [lo, hi] = part(n, r.threads, t);
      auto* g16 = static_cast<std::uint16_t*>(grad.get());
      auto* g32 = static_cast<float*>(grad.get());
      auto* p16 = static_cast<std::uint16_t*>(param16.get());
      for (std::size_t i = lo; i < hi; ++i) {
        chunk.param[i] = value_at(i, 3, -0.05f, 0.05f);
        chunk.exp_avg[i] = value_at(i, 4, -1e-3f, 1e-3f);
        chunk.exp_avg_sq[i] = value_at(i, 5, 1e-8f, 1e-6f);
        const float g = value_at(i, 6, -1e-2f, 1e-2f);
        if (o.grad_dtype == DType::fp32) g32[i] = g;
        else g16[i] = static_cast<std::uint16_t>(std::uint32_t{0x3C00} ^ (i & 0x3FF));  // finite in fp16 and bf16
        p16[i] = 0;
      }
    });
    std::vector<double> times;
    for (int rep = 0; rep <= o.repeats; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      Result<std::size_t> done = adam.step(chunk, 1000 + rep);
      const double s = seconds_since(t0);
      if (!done) return make_error(done.error());
      if (rep > 0) times.push_back(s);
    }
    r.adam_best_s = *std::min_element(times.begin(), times.end());
    r.adam_median_s = median(times);
  } catch (const std::bad_alloc&) {
    return make_error("params: could not allocate " + format_bytes(need_bytes) + " for " +
                      format_count(static_cast<double>(n)) + " parameters");
  }

  r.params_per_s = static_cast<double>(n) / r.adam_best_s;
  r.adam_Bps = r.params_per_s * r.bytes_per_param;
  r.triad_Bps = kTriadBytesPerElem * static_cast<double>(n) / r.triad_best_s;
  r.memory_bound_params_per_s = r.triad_Bps / r.bytes_per_param;
  r.fraction_of_bound = r.params_per_s / r.memory_bound_params_per_s;
  return r;
}

}  // namespace memwall::adam
