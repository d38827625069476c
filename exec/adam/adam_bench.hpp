// The CPU Adam benchmark behind `memwall adam-bench`: times CpuAdam::step over a large chunk and a
// STREAM-style triad on the same machine, and computes the metrics of results/METRICS.md
// ("## CPU Adam") exactly as written there. Owns its buffers for the duration of one call.
// Not a test: nothing here checks numbers. Call from one thread at a time.
#pragma once

#include <cstddef>
#include <optional>

#include "exec/adam/adam_types.hpp"
#include "model/result.hpp"

namespace memwall::adam {

// results/METRICS.md, "bytes per parameter": fp32 param, grad, exp_avg, exp_avg_sq read
// (grad at its own width), param, exp_avg, exp_avg_sq written, plus the 16-bit copy if written.
double adam_bytes_per_param(DType grad_dtype, bool writes_param16);

// results/METRICS.md, "triad bytes per element": a[i] = b[i] + s * c[i] over fp32, b and c read,
// a written with non-temporal stores (no write-allocate read, as none is counted for Adam).
constexpr double kTriadBytesPerElem = 12.0;

struct AdamBenchOptions {
  std::size_t params = 100'000'000;
  DType param16_dtype = DType::bf16;
  DType grad_dtype = DType::fp32;
  int threads = 0;           // 0 = all cores
  std::optional<Isa> isa;    // empty = best_isa()
  int repeats = 10;          // timed steps (and triad passes), after one untimed warm-up each
};

struct AdamBenchReport {
  std::size_t params = 0;
  DType param16_dtype = DType::bf16;
  DType grad_dtype = DType::fp32;
  Isa isa = Isa::scalar;
  int threads = 0;
  int repeats = 0;
  double adam_best_s = 0, adam_median_s = 0;  // one step over all params
  double params_per_s = 0;                    // params / adam_best_s
  double bytes_per_param = 0;
  double adam_Bps = 0;                        // params_per_s * bytes_per_param
  double triad_best_s = 0;
  double triad_Bps = 0;                       // kTriadBytesPerElem * params / triad_best_s
  double memory_bound_params_per_s = 0;       // triad_Bps / bytes_per_param
  double fraction_of_bound = 0;               // params_per_s / memory_bound_params_per_s
};

// repeats x params at most this: 100M params x 1000 repeats, about 3 TB of memory traffic.
inline constexpr double kMaxParamUpdates = 1e11;

Result<AdamBenchReport> run_adam_bench(const AdamBenchOptions& options);

}  // namespace memwall::adam
