// AVX2 variant of the quantizer microkernels (quantize/quantize_simd.h): 8 floats a vector, one
// mask byte a vector (vmovmskps). Compiled with -mavx2 -ffp-contract=off.
#include <immintrin.h>

#include "quantize/quantize_simd.h"

namespace whittle::quantize::detail {
namespace {

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

void dorefa_activation_avx2(const float* x, float* y, uint8_t* mask, int64_t n, float clip, float levels,
                            bool unit_clip, bool after_relu) {
  const __m256 zero = _mm256_setzero_ps(), c = _mm256_set1_ps(clip), l = _mm256_set1_ps(levels);
  int64_t i = 0;
  auto above_zero = [&](__m256 v) {
    return after_relu ? _mm256_cmp_ps(v, zero, _CMP_GT_OQ) : _mm256_cmp_ps(v, zero, _CMP_GE_OQ);
  };
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    // vmaxps/vminps return their second operand when either is NaN: NaN passes through, as in
    // dorefa_activation_value.
    __m256 t = _mm256_min_ps(c, _mm256_max_ps(zero, v));
    if (!unit_clip) t = _mm256_div_ps(t, c);
    __m256 q = _mm256_div_ps(_mm256_round_ps(_mm256_mul_ps(t, l), kRound), l);
    if (!unit_clip) q = _mm256_mul_ps(q, c);
    _mm256_storeu_ps(y + i, q);
    if (mask) {
      const __m256 in = _mm256_and_ps(above_zero(v), _mm256_cmp_ps(v, c, _CMP_LE_OQ));
      mask[i / 8] = static_cast<uint8_t>(_mm256_movemask_ps(in));
    }
  }
  dorefa_activation_tail(x, y, mask, i, n, clip, levels, unit_clip, after_relu);
}

void sign_avx2(const float* x, float* y, uint8_t* mask, int64_t n) {
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f), minus_one = _mm256_set1_ps(-1.0f);
  const __m256 abs_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, _mm256_blendv_ps(minus_one, one, _mm256_cmp_ps(v, zero, _CMP_GE_OQ)));
    if (mask)
      mask[i / 8] = static_cast<uint8_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, abs_bits), one, _CMP_LE_OQ)));
  }
  sign_tail(x, y, mask, i, n);
}

void mask_multiply_avx2(const float* g, const uint8_t* mask, float* dx, int64_t n) {
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_set1_epi32(mask[i / 8]);
    const __m256 on = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, lane_bits), lane_bits));
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_and_ps(on, one)));
  }
  mask_multiply_tail(g, mask, dx, i, n);
}

}  // namespace

void lsq_backward_avx2(const float* x, const float* g, float* dx, int64_t n, float s, float b, float lo, float hi,
                       float* ds, float* db) {
  const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b), vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
  const __m256 zero = _mm256_setzero_ps();
  __m256 ds_acc = _mm256_loadu_ps(ds), db_acc = _mm256_loadu_ps(db);  // lane l: elements i ≡ l (mod 8)
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vb), vs);
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 below = _mm256_cmp_ps(v, vlo, _CMP_LE_OQ), above = _mm256_cmp_ps(v, vhi, _CMP_GE_OQ);
    const __m256 outside = _mm256_or_ps(below, above);  // NaN: neither, so inside
    _mm256_storeu_ps(dx + i, _mm256_blendv_ps(gv, zero, outside));
    const __m256 r = _mm256_sub_ps(_mm256_round_ps(v, kRound), v);
    const __m256 bound = _mm256_blendv_ps(vhi, vlo, below);
    ds_acc = _mm256_add_ps(ds_acc, _mm256_mul_ps(gv, _mm256_blendv_ps(r, bound, outside)));
    db_acc = _mm256_add_ps(db_acc, _mm256_blendv_ps(zero, gv, outside));
  }
  _mm256_storeu_ps(ds, ds_acc);
  _mm256_storeu_ps(db, db_acc);
  lsq_backward_tail(x, g, dx, i, n, s, b, lo, hi, ds, db);
}

const QuantizeSimd kQuantizeSimdAvx2 = {dorefa_activation_avx2, sign_avx2, mask_multiply_avx2, lsq_backward_avx2};

}  // namespace whittle::quantize::detail
