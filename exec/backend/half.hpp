// fp32 <-> fp16 / bf16 conversions of one element, shared by the cpu backend and the cuda kernels:
// one source compiled for host and device, so both backends round identically. Integer arithmetic
// only (no float operation whose rounding mode, contraction or flush-to-zero could differ between
// a CPU and a GPU). Rounding is bit for bit what CpuAdam writes for its 16-bit copy
// (exec/adam/adam_kernels.hpp; tests/exec/backend checks it):
//   fp32 -> bf16: round to nearest even; any NaN becomes 0x7FC0 (c10::BFloat16).
//   fp32 -> fp16: IEEE binary16, round to nearest even, subnormals kept, |x| >= 65520 becomes inf;
//                 NaN becomes sign | 0x7E00 (the FP16 library's fp16_ieee_from_fp32_value).
//   fp16 / bf16 -> fp32: exact; an fp16 NaN is quieted with its sign and payload kept (what the
//                 FP16 library's conversion and F16C's vcvtph2ps give).
//   accumulate (add_f32): an IEEE fp32 sum whose NaNs follow x86's rule on every device.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>

#include "exec/adam/adam_types.hpp"

#if defined(__CUDACC__)
#define MEMWALL_HD __host__ __device__
#else
#define MEMWALL_HD
#endif

namespace memwall::exec::half {

MEMWALL_HD inline std::uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MEMWALL_HD inline float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
#endif
}

MEMWALL_HD inline std::uint16_t bf16_from_f32(float f) {
  const std::uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;  // NaN
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

MEMWALL_HD inline float f32_from_bf16(std::uint16_t h) { return float_of(std::uint32_t{h} << 16); }

MEMWALL_HD inline std::uint16_t fp16_from_f32(float f) {
  const std::uint32_t u = bits_of(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);  // NaN
  // 65520 is halfway between 65504 (the largest half) and 65536: ties to even give inf
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (a >= 0x38800000u) {  // |f| >= 2^-14: a normal half; rebias the exponent from 127 to 15
    const std::uint32_t r = a - 0x38000000u;
    return static_cast<std::uint16_t>(sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
  }
  // |f| <= 2^-25, half the smallest subnormal (2^-24): zero (the tie goes to even, 0)
  if (a <= 0x33000000u) return static_cast<std::uint16_t>(sign);
  // a subnormal half: f = m * 2^(e - 150) is m >> (126 - e) units of 2^-24, rounded to nearest even
  const std::uint32_t e = a >> 23, m = (a & 0x007FFFFFu) | 0x00800000u, shift = 126u - e;  // shift 14..24
  const std::uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
  const std::uint32_t up = rest > halfway || (rest == halfway && (q & 1u)) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (q + up));  // q + up == 0x400 is the smallest normal: right
}

MEMWALL_HD inline float f32_from_fp16(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return float_of(sign | 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0u));  // inf, NaN
  if (e != 0) return float_of(sign | ((e + 112u) << 23) | (m << 13));
  // zero or subnormal: m * 2^-24, exact in fp32 (and a normal fp32 when m != 0)
  return float_of(sign | bits_of(static_cast<float>(m) * 0x1.0p-24f));
}

// a + b with x86 SSE's NaN rule on every device, so a sum that is NaN has the same bits on the
// cpu and cuda backends (a GPU returns its canonical NaN 0x7FFFFFFF instead, and fp16 keeps a
// NaN's sign): a NaN operand propagates, quieted, the first one if both are; inf - inf gives
// x86's default NaN 0xFFC00000. Not a NaN: the IEEE sum, rounded to nearest even.
MEMWALL_HD inline float add_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  const float s = __fadd_rn(a, b);
#else
  const float s = a + b;
#endif
  if (s == s) return s;
  if (a != a) return float_of(bits_of(a) | 0x00400000u);
  if (b != b) return float_of(bits_of(b) | 0x00400000u);
  return float_of(0xFFC00000u);
}

MEMWALL_HD inline std::uint16_t half_from_f32(float f, adam::DType t) {
  return t == adam::DType::fp16 ? fp16_from_f32(f) : bf16_from_f32(f);
}

MEMWALL_HD inline float f32_from_half(std::uint16_t h, adam::DType t) {
  return t == adam::DType::fp16 ? f32_from_fp16(h) : f32_from_bf16(h);
}

// Element i of an array of type t (fp32, fp16 or bf16), as fp32: a load and an exact widening.
MEMWALL_HD inline float element_f32(const void* x, adam::DType t, long i) {
  return t == adam::DType::fp32 ? static_cast<const float*>(x)[i]
                                : f32_from_half(static_cast<const std::uint16_t*>(x)[i], t);
}
}  // namespace memwall::exec::half
