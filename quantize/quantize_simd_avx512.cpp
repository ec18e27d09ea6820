// AVX-512 variant of the quantizer microkernels (quantize/quantize_simd.h): 16 floats a vector,
// two mask bytes a vector (the compare's __mmask16). Compiled with -mavx512f -ffp-contract=off.
#include <immintrin.h>

#include <cstring>

#include "quantize/quantize_simd.h"

namespace whittle::quantize::detail {
namespace {

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

void store_mask16(uint8_t* mask, int64_t i, __mmask16 k) {
  const auto bits = static_cast<uint16_t>(k);
  std::memcpy(mask + i / 8, &bits, 2);  // little-endian: element i in the low byte's bit 0
}

__mmask16 load_mask16(const uint8_t* mask, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, mask + i / 8, 2);
  return static_cast<__mmask16>(bits);
}

void dorefa_activation_avx512(const float* x, float* y, uint8_t* mask, int64_t n, float clip, float levels,
                              bool unit_clip, bool after_relu) {
  const __m512 zero = _mm512_setzero_ps(), c = _mm512_set1_ps(clip), l = _mm512_set1_ps(levels);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    __m512 t = _mm512_min_ps(c, _mm512_max_ps(zero, v));  // NaN passes through (second operand)
    if (!unit_clip) t = _mm512_div_ps(t, c);
    __m512 q = _mm512_div_ps(_mm512_roundscale_ps(_mm512_mul_ps(t, l), kRound), l);
    if (!unit_clip) q = _mm512_mul_ps(q, c);
    _mm512_storeu_ps(y + i, q);
    if (mask)
      store_mask16(mask, i,
                   (after_relu ? _mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ) : _mm512_cmp_ps_mask(v, zero, _CMP_GE_OQ)) &
                       _mm512_cmp_ps_mask(v, c, _CMP_LE_OQ));
  }
  dorefa_activation_tail(x, y, mask, i, n, clip, levels, unit_clip, after_relu);
}

void sign_avx512(const float* x, float* y, uint8_t* mask, int64_t n) {
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f), minus_one = _mm512_set1_ps(-1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(y + i, _mm512_mask_mov_ps(minus_one, _mm512_cmp_ps_mask(v, zero, _CMP_GE_OQ), one));
    if (mask) store_mask16(mask, i, _mm512_cmp_ps_mask(_mm512_abs_ps(v), one, _CMP_LE_OQ));
  }
  sign_tail(x, y, mask, i, n);
}

void mask_multiply_avx512(const float* g, const uint8_t* mask, float* dx, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dx + i, _mm512_mul_ps(_mm512_loadu_ps(g + i), _mm512_maskz_mov_ps(load_mask16(mask, i), one)));
  mask_multiply_tail(g, mask, dx, i, n);
}

}  // namespace

// LSQ's backward: the AVX2 form (eight lanes, the sums every variant gives).
const QuantizeSimd kQuantizeSimdAvx512 = {dorefa_activation_avx512, sign_avx512, mask_multiply_avx512,
                                          lsq_backward_avx2};

}  // namespace whittle::quantize::detail
