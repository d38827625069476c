// The AVX-512 Adam kernel: 16 fp32 lanes, the remainder in one masked iteration (no scalar tail).
// Compiled with -mavx512f -mavx512bw -mavx512vl (this file only); called only after CPU detection
// found all three. Bit-identical to the scalar kernel. Stateless; thread-safe.
#include <immintrin.h>

#include "exec/adam/adam_kernels.hpp"

namespace memwall::adam::detail {
namespace {

constexpr std::size_t kStreamMinElems = 1 << 20;  // 2 MiB of copy per thread: beyond L2

template <DType G>
inline __m512 load_grad16(const void* grad, std::size_t i, __mmask16 k) {
  if constexpr (G == DType::fp32) {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(grad) + i);
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const std::uint16_t*>(grad) + i);
    if constexpr (G == DType::fp16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// bf16_from_f32, 16 at a time. Not vcvtneps2bf16 (AVX512_BF16): it flushes subnormal inputs and
// outputs to zero, while torch's .to(torch.bfloat16) keeps them.
inline __m256i bf16_from_f32x16(__m512 p) {
  __m512i u = _mm512_castps_si512(p);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

template <DType C>
inline __m256i half_from_f32x16(__m512 p) {
  if constexpr (C == DType::fp16) return _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  else return bf16_from_f32x16(p);
}

// Stream: a non-temporal store (dst + i must be 32-byte aligned, k all ones).
template <DType C, bool Stream>
inline void store_half16(void* dst, std::size_t i, __m512 p, __mmask16 k) {
  std::uint16_t* out = static_cast<std::uint16_t*>(dst) + i;
  if constexpr (Stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(out), half_from_f32x16<C>(p));
  else _mm256_mask_storeu_epi16(out, k, half_from_f32x16<C>(p));
}

struct Consts {
  __m512 inv_scale, clip, l2, decay, b1, c1, b2, c2, bc2, eps, neg_step;
  explicit Consts(const StepScalars& s)
      : inv_scale(_mm512_set1_ps(s.inv_loss_scale)), clip(_mm512_set1_ps(s.clip_coef)),
        l2(_mm512_set1_ps(s.l2)), decay(_mm512_set1_ps(s.param_decay)), b1(_mm512_set1_ps(s.beta1)),
        c1(_mm512_set1_ps(s.one_minus_beta1)), b2(_mm512_set1_ps(s.beta2)),
        c2(_mm512_set1_ps(s.one_minus_beta2)), bc2(_mm512_set1_ps(s.bias_correction2_sqrt)),
        eps(_mm512_set1_ps(s.eps)), neg_step(_mm512_set1_ps(s.neg_step_size)) {}
};

// C == fp32 means "no 16-bit copy".
template <DType G, DType C, bool Stream = false>
inline void step16(const KernelArgs& a, const Consts& c, std::size_t i, __mmask16 k) {
  __m512 p = _mm512_maskz_loadu_ps(k, a.param + i);
  __m512 g = load_grad16<G>(a.grad, i, k);
  __m512 m = _mm512_maskz_loadu_ps(k, a.exp_avg + i);
  __m512 v = _mm512_maskz_loadu_ps(k, a.exp_avg_sq + i);
  // Same operations, same order as adam_element.
  g = _mm512_mul_ps(_mm512_mul_ps(g, c.inv_scale), c.clip);
  if (a.s.use_l2) g = _mm512_fmadd_ps(p, c.l2, g);
  if (a.s.decoupled) p = _mm512_mul_ps(p, c.decay);
  m = _mm512_fmadd_ps(g, c.c1, _mm512_mul_ps(m, c.b1));
  v = _mm512_fmadd_ps(_mm512_mul_ps(c.c2, g), g, _mm512_mul_ps(v, c.b2));
  __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), c.bc2), c.eps);
  p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(c.neg_step, m), denom));
  _mm512_mask_storeu_ps(a.param + i, k, p);
  _mm512_mask_storeu_ps(a.exp_avg + i, k, m);
  _mm512_mask_storeu_ps(a.exp_avg_sq + i, k, v);
  if constexpr (C != DType::fp32) store_half16<C, Stream>(a.param16, i, p, k);
}

template <DType G, DType C>
void adam_avx512_t(const KernelArgs& a) {
  const Consts c(a.s);
  std::size_t i = 0;
  // The copy is the one array written without being read: stream it past the cache, so it costs
  // its 2 bytes per parameter and no write-allocate read (results/METRICS.md). Only for ranges far
  // larger than the cache; a small chunk's copy is better left in cache for whoever reads it next.
  const auto addr = reinterpret_cast<std::uintptr_t>(a.param16);
  if (C != DType::fp32 && a.n >= kStreamMinElems && addr % 2 == 0) {
    const std::size_t head = ((32 - addr % 32) % 32) / 2;  // elements until a 32-byte boundary
    if (head) step16<G, C>(a, c, 0, static_cast<__mmask16>((1u << head) - 1));
    for (i = head; i + 16 <= a.n; i += 16) step16<G, C, true>(a, c, i, 0xFFFF);
    _mm_sfence();
  } else {
    for (; i + 16 <= a.n; i += 16) step16<G, C>(a, c, i, 0xFFFF);
  }
  if (i < a.n) step16<G, C>(a, c, i, static_cast<__mmask16>((1u << (a.n - i)) - 1));
}

template <DType G>
AdamKernel pick_copy(const KernelArgs& a) {
  if (!a.param16) return adam_avx512_t<G, DType::fp32>;
  return a.param16_dtype == DType::fp16 ? adam_avx512_t<G, DType::fp16> : adam_avx512_t<G, DType::bf16>;
}

void adam_avx512(const KernelArgs& a) {
  AdamKernel k = a.grad_dtype == DType::fp32   ? pick_copy<DType::fp32>(a)
                 : a.grad_dtype == DType::fp16 ? pick_copy<DType::fp16>(a)
                                               : pick_copy<DType::bf16>(a);
  k(a);
}

void convert_avx512(const float* src, void* dst, DType t, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) {
    __mmask16 k = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 p = _mm512_maskz_loadu_ps(k, src + i);
    if (t == DType::fp16) store_half16<DType::fp16, false>(dst, i, p, k);
    else store_half16<DType::bf16, false>(dst, i, p, k);
  }
}

}  // namespace

KernelTable avx512_kernels() { return {Isa::avx512, adam_avx512, convert_avx512}; }

}  // namespace memwall::adam::detail
