// The AVX2 + FMA + F16C Adam kernel: 8 fp32 lanes, the remainder through the shared scalar step.
// Compiled with -mavx2 -mfma -mf16c (this file only); called only after CPU detection found all
// three. Bit-identical to the scalar kernel. Stateless; thread-safe.
#include <immintrin.h>

#include "exec/adam/adam_kernels.hpp"

namespace memwall::adam::detail {
namespace {

constexpr std::size_t kStreamMinElems = 1 << 20;  // 2 MiB of copy per thread: beyond L2

template <DType G>
inline __m256 load_grad8(const void* grad, std::size_t i) {
  if constexpr (G == DType::fp32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(grad) + i));
    if constexpr (G == DType::fp16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Round to nearest even into the low 16 bits of each lane (bf16_from_f32, 8 at a time).
inline __m128i bf16_from_f32x8(__m256 p) {
  __m256i u = _mm256_castps_si256(p);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  __m256 nan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// Stream: a non-temporal store (dst + i must be 16-byte aligned).
template <DType C, bool Stream = false>
inline void store_half8(void* dst, std::size_t i, __m256 p) {
  __m128i h;
  if constexpr (C == DType::fp16) h = _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  else h = bf16_from_f32x8(p);
  auto* out = reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(dst) + i);
  if constexpr (Stream) _mm_stream_si128(out, h);
  else _mm_storeu_si128(out, h);
}

// Elements [begin, begin + 8 * groups). C == fp32 means "no 16-bit copy".
template <DType G, DType C, bool Stream>
void adam_avx2_groups(const KernelArgs& a, std::size_t begin, std::size_t groups) {
  const StepScalars& s = a.s;
  const __m256 inv_scale = _mm256_set1_ps(s.inv_loss_scale), clip = _mm256_set1_ps(s.clip_coef);
  const __m256 l2 = _mm256_set1_ps(s.l2), decay = _mm256_set1_ps(s.param_decay);
  const __m256 b1 = _mm256_set1_ps(s.beta1), c1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(s.beta2), c2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 bc2 = _mm256_set1_ps(s.bias_correction2_sqrt), eps = _mm256_set1_ps(s.eps);
  const __m256 neg_step = _mm256_set1_ps(s.neg_step_size);
  const std::size_t end = begin + 8 * groups;
  for (std::size_t i = begin; i < end; i += 8) {
    __m256 p = _mm256_loadu_ps(a.param + i);
    __m256 g = load_grad8<G>(a.grad, i);
    __m256 m = _mm256_loadu_ps(a.exp_avg + i);
    __m256 v = _mm256_loadu_ps(a.exp_avg_sq + i);
    // Same operations, same order as adam_element.
    g = _mm256_mul_ps(_mm256_mul_ps(g, inv_scale), clip);
    if (s.use_l2) g = _mm256_fmadd_ps(p, l2, g);
    if (s.decoupled) p = _mm256_mul_ps(p, decay);
    m = _mm256_fmadd_ps(g, c1, _mm256_mul_ps(m, b1));
    v = _mm256_fmadd_ps(_mm256_mul_ps(c2, g), g, _mm256_mul_ps(v, b2));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2), eps);
    p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step, m), denom));
    _mm256_storeu_ps(a.param + i, p);
    _mm256_storeu_ps(a.exp_avg + i, m);
    _mm256_storeu_ps(a.exp_avg_sq + i, v);
    if constexpr (C != DType::fp32) store_half8<C, Stream>(a.param16, i, p);
  }
}

template <DType G, DType C>
void adam_avx2_t(const KernelArgs& a) {
  // The copy is the one array written without being read: stream it past the cache, so it costs
  // its 2 bytes per parameter and no write-allocate read (results/METRICS.md). Only for ranges far
  // larger than the cache; a small chunk's copy is better left in cache for whoever reads it next.
  const auto addr = reinterpret_cast<std::uintptr_t>(a.param16);
  std::size_t i = 0;
  if (C != DType::fp32 && a.n >= kStreamMinElems && addr % 2 == 0) {
    const std::size_t head = ((16 - addr % 16) % 16) / 2;  // elements until a 16-byte boundary
    adam_scalar_range(a, 0, head);
    const std::size_t groups = (a.n - head) / 8;
    adam_avx2_groups<G, C, true>(a, head, groups);
    _mm_sfence();
    i = head + 8 * groups;
  } else {
    adam_avx2_groups<G, C, false>(a, 0, a.n / 8);
    i = a.n / 8 * 8;
  }
  adam_scalar_range(a, i, a.n);
}

template <DType G>
AdamKernel pick_copy(const KernelArgs& a) {
  if (!a.param16) return adam_avx2_t<G, DType::fp32>;
  return a.param16_dtype == DType::fp16 ? adam_avx2_t<G, DType::fp16> : adam_avx2_t<G, DType::bf16>;
}

void adam_avx2(const KernelArgs& a) {
  AdamKernel k = a.grad_dtype == DType::fp32   ? pick_copy<DType::fp32>(a)
                 : a.grad_dtype == DType::fp16 ? pick_copy<DType::fp16>(a)
                                               : pick_copy<DType::bf16>(a);
  k(a);
}

void convert_avx2(const float* src, void* dst, DType t, std::size_t n) {
  const std::size_t vec_end = n / 8 * 8;
  for (std::size_t i = 0; i < vec_end; i += 8) {
    __m256 p = _mm256_loadu_ps(src + i);
    if (t == DType::fp16) store_half8<DType::fp16>(dst, i, p);
    else store_half8<DType::bf16>(dst, i, p);
  }
  convert_scalar_range(src, dst, t, vec_end, n);
}

}  // namespace

KernelTable avx2_kernels() { return {Isa::avx2, adam_avx2, convert_avx2}; }

}  // namespace memwall::adam::detail
