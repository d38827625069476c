// CPU Adam/AdamW over fp32 master parameters, momentum and variance that writes the fp16/bf16
// parameter copy in the same pass (ZeRO-Offload/ZeRO-Infinity's CPU optimizer, Sec. 5.2.2).
// Owns: the update kernels, run-time ISA dispatch and a worker pool. Does not own: the buffers
// (the caller's; any alignment; one chunk of a larger tensor) or the step counter.
// Thread-safety: one CpuAdam is driven by one thread at a time; distinct objects are independent.
//
// Instruction sets (chosen once, at create(), from CPUID unless the caller forces one):
//   avx512  AVX-512F + BW + VL: 16 lanes, masked tail.                 adam_avx512.cpp
//   avx2    AVX2 + FMA + F16C: 8 lanes, tail through the scalar step.   adam_avx2.cpp
//   scalar  plain C++ (libm fmaf where the CPU has no FMA).             adam_scalar.cpp
// The vector files alone are compiled with -m flags and are only entered after detection, so the
// library runs on any x86-64 CPU. All three give bit-identical results: each rounds every
// operation exactly as torch 1.13's Adam does on CPU (see adam_element in adam_kernels.hpp).
// AVX512_BF16's vcvtneps2bf16 and AVX512_FP16 are not used: the former flushes subnormals that
// torch's conversion keeps, and AVX-512F's vcvtps2ph already converts to fp16 at full width.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "exec/adam/adam_types.hpp"
#include "model/result.hpp"

namespace memwall::adam {

std::string_view isa_name(Isa isa);        // "scalar", "avx2", "avx512"
Result<Isa> parse_isa(std::string_view s);
std::string_view dtype_name(DType t);      // "fp32", "fp16", "bf16"
Result<DType> parse_dtype(std::string_view s);
std::size_t dtype_bytes(DType t);          // 4 or 2

bool isa_supported(Isa isa);               // compiled in and present on this CPU
Isa best_isa();                            // avx512 > avx2 > scalar
std::vector<Isa> supported_isas();         // every path this CPU can run, scalar first

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // false: torch.optim.Adam (L2 term added to the gradient);
                                        // true: torch.optim.AdamW (param *= 1 - lr * weight_decay)
};

// Applied to the gradient before the update, in torch's order: grad * float(1 / loss_scale)
// (GradScaler.unscale_), then * clip_coef (clip_grad_norm_'s clamped coefficient).
struct GradScaling {
  double loss_scale = 1.0;  // > 0
  double clip_coef = 1.0;   // >= 0
};

// One range of a larger tensor; every pointer covers n elements and no two arrays overlap.
struct AdamChunk {
  float* param = nullptr;       // (n) fp32 master parameters, updated in place
  float* exp_avg = nullptr;     // (n) momentum, updated in place
  float* exp_avg_sq = nullptr;  // (n) variance, updated in place
  const void* grad = nullptr;   // (n) of grad_dtype; read only
  DType grad_dtype = DType::fp32;
  void* param16 = nullptr;      // (n) of param16_dtype: the updated parameters, rounded to nearest
                                // even (NaN stays NaN); nullptr = no copy
  DType param16_dtype = DType::bf16;
  std::size_t n = 0;
};

// The fp32 constants of step `step` (>= 1) with these options: Python float arithmetic (double)
// first, then the cast ATen applies when the scalar meets a float tensor.
StepScalars step_scalars(const AdamOptions& options, long step, const GradScaling& scaling = {});

class CpuAdam {
 public:
  // threads: the pool's size; 0 = every core this process may use (host_cores.hpp). isa: empty = best_isa(); forcing a path the
  // CPU lacks is an error, so tests can run every supported path.
  static Result<CpuAdam> create(const AdamOptions& options, int threads = 0, std::optional<Isa> isa = {});

  // One Adam step over the chunk. step is the step number after incrementing (1 on the first
  // update), torch's state['step']; bias corrections use it. `lr`: this step's rate (a schedule's,
  // lr_schedule.hpp) instead of options().lr. Returns the number of elements updated.
  Result<std::size_t> step(const AdamChunk& chunk, long step, const GradScaling& scaling = {},
                           std::optional<double> lr = {});

  // fp32 -> fp16/bf16 with the same rounding as the copy step() writes. Returns n.
  Result<std::size_t> convert(const float* src, void* dst, DType dst_dtype, std::size_t n);

  const AdamOptions& options() const;
  Isa isa() const;
  int threads() const;  // the pool's size
  // At most n threads (clamped to [1, threads()]) from the next call on: a busy machine's share
  // (the engine fits it to the load, host_cores.hpp). Any thread; takes effect between calls.
  void set_threads_in_use(int n);
  int threads_in_use() const;

  CpuAdam(CpuAdam&&) noexcept;
  CpuAdam& operator=(CpuAdam&&) noexcept;
  ~CpuAdam();

 private:
  struct Impl;
  explicit CpuAdam(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace memwall::adam
