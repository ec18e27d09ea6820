// AVX2 int8 convolution and addition (kernels/int8_conv.h, kernels/int8_gemm.h): compiled with
// -mavx2 -ffp-contract=off.
//
// Without VNNI the codes are widened to int16 (the input when it is padded, the weight when it is
// packed) and multiplied with vpmaddwd, which adds pairs of products into int32 exactly (a pair is at
// most 2·255·128, where vpmaddubsw's 16-bit sums saturate). A block of P ≤ 4 output pixels × 16
// output channels keeps 2·P accumulators of 8 channels; each step broadcasts two input channels of
// each pixel and loads two channels of the 16 output channels' weights.

#include <immintrin.h>

#include <array>
#include <cstring>
#include <utility>

#include "kernels/int8_gemm.h"

namespace whittle::kernels::detail {
namespace {

// Requantizes 8 sums of output channels o0.. and stores the first `count` (≤ 8) at element `at` of
// the output (codes, or floats when g.y_float is set).
inline void store8(__m256i acc, const Int8ConvArgs& g, int64_t o0, int64_t at, int64_t count) {
  if (count <= 0) return;
  const __m256i zw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.zx_wsum + o0));
  const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc, zw)), _mm256_loadu_ps(g.m + o0));
  __m256 u = _mm256_add_ps(v, _mm256_loadu_ps(g.c + o0));
  if (g.y_float) {
    if (count >= 8) {
      _mm256_storeu_ps(g.y_float + at, u);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, u);
      std::memcpy(g.y_float + at, tmp, static_cast<size_t>(count) * sizeof(float));
    }
    return;
  }
  uint8_t* out = g.y + at;
  u = _mm256_min_ps(_mm256_max_ps(u, _mm256_set1_ps(-1.0f)), _mm256_set1_ps(256.0f));
  __m256i q = _mm256_cvtps_epi32(u);  // the default rounding mode: half to even
  q = _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(g.lo)), _mm256_set1_epi32(255));
  const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  const __m128i bytes = _mm_packus_epi16(words, words);
  if (count >= 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), bytes);
  } else {
    alignas(16) uint8_t tmp[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), bytes);
    std::memcpy(out, tmp, static_cast<size_t>(count));
  }
}

// P pixels (from x0, the padded input under the first tap of the first pixel) × the 16 output
// channels of block ob, written from output element y0.
template <int P>
void block(const Int8ConvArgs& g, const int16_t* x0, int64_t ob, int64_t y0) {
  const int64_t Cd = g.Cp / 2, taps = g.KH * g.KW;
  const int64_t pixel_stride = g.SW * g.Cp;
  const int16_t* w = static_cast<const int16_t*>(g.w) + ob * taps * Cd * 32;
  __m256i acc[P][2];
#pragma GCC unroll 6
  for (int p = 0; p < P; ++p) acc[p][0] = acc[p][1] = _mm256_setzero_si256();
  for (int64_t kh = 0; kh < g.KH; ++kh)
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int16_t* xt = x0 + (kh * g.Wp + kw) * g.Cp;
      const int16_t* wt = w + (kh * g.KW + kw) * Cd * 32;
      for (int64_t d = 0; d < Cd; ++d) {
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + d * 32));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + d * 32 + 16));
#pragma GCC unroll 6
        for (int p = 0; p < P; ++p) {
          int32_t two;
          std::memcpy(&two, xt + p * pixel_stride + d * 2, 4);
          const __m256i xb = _mm256_set1_epi32(two);
          acc[p][0] = _mm256_add_epi32(acc[p][0], _mm256_madd_epi16(xb, w0));
          acc[p][1] = _mm256_add_epi32(acc[p][1], _mm256_madd_epi16(xb, w1));
        }
      }
    }
  const int64_t o0 = ob * 16;
#pragma GCC unroll 6
  for (int p = 0; p < P; ++p) {
    store8(acc[p][0], g, o0, y0 + p * g.O + o0, g.O - o0);
    store8(acc[p][1], g, o0 + 8, y0 + p * g.O + o0 + 8, g.O - o0 - 8);
  }
}

using BlockFn = void (*)(const Int8ConvArgs&, const int16_t*, int64_t, int64_t);

template <int... Ps>
constexpr std::array<BlockFn, sizeof...(Ps)> tails(std::integer_sequence<int, Ps...>) {
  return {&block<Ps + 1>...};
}

}  // namespace

void int8_conv_rows_avx2(const Int8ConvArgs& g, int64_t row_begin, int64_t row_end) {
  constexpr int P = 4;
  static constexpr std::array<BlockFn, P> tail = tails(std::make_integer_sequence<int, P>{});
  const auto* x = static_cast<const int16_t*>(g.x);
  const int64_t OB = (g.O + 15) / 16;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t n = r / g.OH, oh = r % g.OH;
    const int16_t* xrow = x + (n * g.Hp + oh * g.SH) * g.Wp * g.Cp;
    const int64_t yrow = r * g.OW * g.O;
    for (int64_t ob = 0; ob < OB; ++ob) {
      int64_t ow = 0;
      for (; ow + P <= g.OW; ow += P) block<P>(g, xrow + ow * g.SW * g.Cp, ob, yrow + ow * g.O);
      if (ow < g.OW) tail[g.OW - ow - 1](g, xrow + ow * g.SW * g.Cp, ob, yrow + ow * g.O);
    }
  }
}

void int8_add_avx2(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, float ma, float mb, float c,
                   int32_t lo) {
  const __m256 vma = _mm256_set1_ps(ma), vmb = _mm256_set1_ps(mb), vc = _mm256_set1_ps(c);
  const __m256 fmin = _mm256_set1_ps(-1.0f), fmax = _mm256_set1_ps(256.0f);
  const __m256i ilo = _mm256_set1_epi32(lo), ihi = _mm256_set1_epi32(255);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 fa = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + i))));
    const __m256 fb = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + i))));
    const __m256 s = _mm256_add_ps(_mm256_mul_ps(fa, vma), _mm256_mul_ps(fb, vmb));
    const __m256 u = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(s, vc), fmin), fmax);
    const __m256i q = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(u), ilo), ihi);
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(y + i), _mm_packus_epi16(words, words));
  }
  for (; i < n; ++i) {
    const float s = static_cast<float>(a[i]) * ma + static_cast<float>(b[i]) * mb;
    y[i] = round_to_code(s + c, lo);
  }
}

}  // namespace whittle::kernels::detail
