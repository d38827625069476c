// Internal to exec/adam: the table of per-ISA kernels and the scalar pieces every kernel shares
// (one Adam element step in torch's order of operations, fp32 <-> fp16/bf16 conversions).
// Not for callers outside exec/adam: use cpu_adam.hpp. Functions here are pure; thread-safe.
// Everything is `static inline` and uses builtins, not <cmath>: this header is compiled into
// TUs with different -m flags, and internal linkage keeps an AVX-512 copy from being shared.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exec/adam/adam_types.hpp"

namespace memwall::adam::detail {

using StepScalars = adam::StepScalars;  // adam_types.hpp: also what the cuda backend's Adam kernel takes

struct KernelArgs {
  float* param;        // (n)
  const void* grad;    // (n) of grad_dtype
  float* exp_avg;      // (n)
  float* exp_avg_sq;   // (n)
  void* param16;       // (n) of param16_dtype, or nullptr
  std::size_t n;
  DType grad_dtype;
  DType param16_dtype;
  StepScalars s;
};

using AdamKernel = void (*)(const KernelArgs& a);
using ConvertKernel = void (*)(const float* src, void* dst, DType dst_dtype, std::size_t n);

struct KernelTable {
  Isa isa;
  AdamKernel adam;
  ConvertKernel convert;  // fp32 -> fp16/bf16, the same rounding as the Adam copy
};

KernelTable scalar_kernels();
KernelTable avx2_kernels();    // defined only when the compiler can target AVX2 (x86-64)
KernelTable avx512_kernels();  // defined only when the compiler can target AVX-512

static inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}
static inline float float_of(std::uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// c10::BFloat16's round_to_nearest_even: NaN becomes 0x7FC0.
static inline std::uint16_t bf16_from_f32(float f) {
  if (f != f) return 0x7FC0;
  std::uint32_t u = bits_of(f);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float f32_from_bf16(std::uint16_t h) { return float_of(std::uint32_t{h} << 16); }

// IEEE binary16, round to nearest even, subnormals kept; NaN becomes a quiet NaN (sign kept).
// The FP16 library's fp16_ieee_from_fp32_value, which c10::Half uses; needs FTZ/DAZ off (default).
static inline std::uint16_t fp16_from_f32(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (__builtin_fabsf(f) * scale_to_inf) * scale_to_zero;
  const std::uint32_t w = bits_of(f);
  const std::uint32_t shl1_w = w + w;
  const std::uint32_t sign = w & 0x80000000u;
  std::uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_of((bias >> 1) + 0x07800000u) + base;
  const std::uint32_t b = bits_of(base);
  const std::uint32_t exp_bits = (b >> 13) & 0x00007C00u;
  const std::uint32_t mantissa_bits = b & 0x00000FFFu;
  const std::uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<std::uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// Exact (every binary16 value is an fp32 value); the FP16 library's fp16_ieee_to_fp32_value.
static inline float f32_from_fp16(std::uint16_t h) {
  const std::uint32_t w = std::uint32_t{h} << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;
  const float normalized = float_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = float_of((two_w >> 17) | (126u << 23)) - 0.5f;
  const std::uint32_t result = sign | (two_w < (1u << 27) ? bits_of(denormalized) : bits_of(normalized));
  return float_of(result);
}

static inline float load_grad(const void* grad, DType t, std::size_t i) {
  switch (t) {
    case DType::fp16: return f32_from_fp16(static_cast<const std::uint16_t*>(grad)[i]);
    case DType::bf16: return f32_from_bf16(static_cast<const std::uint16_t*>(grad)[i]);
    case DType::fp32: break;
  }
  return static_cast<const float*>(grad)[i];
}

static inline std::uint16_t half_from_f32(float f, DType t) {
  return t == DType::fp16 ? fp16_from_f32(f) : bf16_from_f32(f);
}

// One element of torch.optim.Adam/AdamW, operation for operation as ATen's AVX2 kernels round:
// add(alpha) is one fused multiply-add, addcmul is fma(value * t1, t2, self), addcdiv is
// self + (value * t1) / t2, division by a scalar is a true division.
static inline void adam_element(float& p, float g, float& m, float& v, const StepScalars& s) {
  g = g * s.inv_loss_scale;                                   // GradScaler.unscale_
  g = g * s.clip_coef;                                        // clip_grad_norm_
  if (s.use_l2) g = __builtin_fmaf(p, s.l2, g);               // grad.add(param, alpha=wd)
  if (s.decoupled) p = p * s.param_decay;                     // param.mul_(1 - lr * wd)
  m = __builtin_fmaf(g, s.one_minus_beta1, m * s.beta1);      // exp_avg.mul_(b1).add_(g, alpha=1-b1)
  v = __builtin_fmaf(s.one_minus_beta2 * g, g, v * s.beta2);  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
  const float denom = __builtin_sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  p = p + (s.neg_step_size * m) / denom;                      // param.addcdiv_(m, denom, -step_size)
}

// The scalar loop over [begin, end), used by the scalar kernel and for the vector kernels' tails.
static inline void adam_scalar_range(const KernelArgs& a, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    float p = a.param[i], m = a.exp_avg[i], v = a.exp_avg_sq[i];
    adam_element(p, load_grad(a.grad, a.grad_dtype, i), m, v, a.s);
    a.param[i] = p;
    a.exp_avg[i] = m;
    a.exp_avg_sq[i] = v;
    if (a.param16) static_cast<std::uint16_t*>(a.param16)[i] = half_from_f32(p, a.param16_dtype);
  }
}

static inline void convert_scalar_range(const float* src, void* dst, DType t, std::size_t begin,
                                        std::size_t end) {
  auto* out = static_cast<std::uint16_t*>(dst);
  for (std::size_t i = begin; i < end; ++i) out[i] = half_from_f32(src[i], t);
}

}  // namespace memwall::adam::detail
