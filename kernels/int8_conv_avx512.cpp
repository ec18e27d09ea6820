// AVX-512 VNNI int8 convolution and addition (kernels/int8_conv.h, kernels/int8_gemm.h): compiled
// with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -ffp-contract=off.
//
// Outer-product form: a block of P output pixels × V vectors of 16 output channels keeps P·V int32
// accumulators (P·V = 16), one lane per output channel. Each step loads 4 input channels of V·16
// output channels of the weight (64 bytes a vector), broadcasts the 4 uint8 codes of those channels
// of each pixel, and adds the four products per lane with vpdpbusd. The epilogue requantizes 16
// lanes at a time in float32 and stores bytes (masked for the last ⌈O/16⌉ block).

#include <immintrin.h>

#include <array>
#include <cstring>
#include <utility>

#include "kernels/int8_gemm.h"

namespace whittle::kernels::detail {
namespace {

// The requantization constants of 16 output channels, loaded once for a block's pixels.
struct Epilogue16 {
  __m512i zw;
  __m512 m, c;
  __mmask16 mask;
};

inline Epilogue16 epilogue16(const Int8ConvArgs& g, int64_t o0) {
  const int64_t left = g.O - o0;
  return {_mm512_loadu_si512(g.zx_wsum + o0), _mm512_loadu_ps(g.m + o0), _mm512_loadu_ps(g.c + o0),
          left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u)};
}

// Requantizes 16 sums and stores the lanes of e.mask at element `at` of the output (codes, or
// floats when g.y_float is set).
inline void store16(__m512i acc, const Epilogue16& e, __m512i lo, const Int8ConvArgs& g, int64_t at) {
  const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, e.zw)), e.m);
  __m512 u = _mm512_add_ps(v, e.c);
  if (g.y_float) {
    _mm512_mask_storeu_ps(g.y_float + at, e.mask, u);
    return;
  }
  uint8_t* out = g.y + at;
  u = _mm512_min_ps(_mm512_max_ps(u, _mm512_set1_ps(-1.0f)), _mm512_set1_ps(256.0f));
  __m512i q = _mm512_cvtps_epi32(u);  // the default rounding mode: half to even
  q = _mm512_min_epi32(_mm512_max_epi32(q, lo), _mm512_set1_epi32(255));
  _mm_mask_storeu_epi8(out, e.mask, _mm512_cvtepi32_epi8(q));
}

// P pixels (starting at x0, the padded input under the first tap of the first pixel) × V blocks of
// 16 output channels (from block ob0), written from output element y0 (the first pixel's).
template <int V, int P>
void block(const Int8ConvArgs& g, const uint8_t* x0, int64_t ob0, int64_t y0) {
  const int64_t Cq = g.Cp / 4, taps = g.KH * g.KW;
  const int64_t ob_stride = taps * Cq * 64;
  const int64_t pixel_stride = g.SW * g.Cp;
  const int8_t* w = static_cast<const int8_t*>(g.w) + ob0 * ob_stride;
  __m512i acc[P][V];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[p][v] = _mm512_setzero_si512();
  for (int64_t kh = 0; kh < g.KH; ++kh)
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const uint8_t* xt = x0 + (kh * g.Wp + kw) * g.Cp;
      const int8_t* wt = w + (kh * g.KW + kw) * Cq * 64;
      for (int64_t q = 0; q < Cq; ++q) {
        __m512i wv[V];
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_si512(wt + v * ob_stride + q * 64);
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) {
          int32_t four;
          std::memcpy(&four, xt + p * pixel_stride + q * 4, 4);
          const __m512i xb = _mm512_set1_epi32(four);
#pragma GCC unroll 4
          for (int v = 0; v < V; ++v) acc[p][v] = _mm512_dpbusd_epi32(acc[p][v], xb, wv[v]);
        }
      }
    }
  const __m512i lo = _mm512_set1_epi32(g.lo);
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    const int64_t o0 = (ob0 + v) * 16;
    const Epilogue16 e = epilogue16(g, o0);
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) store16(acc[p][v], e, lo, g, y0 + p * g.O + o0);
  }
}

using BlockFn = void (*)(const Int8ConvArgs&, const uint8_t*, int64_t, int64_t);

template <int V, int... Ps>
constexpr std::array<BlockFn, sizeof...(Ps)> tails(std::integer_sequence<int, Ps...>) {
  return {&block<V, Ps + 1>...};
}

// One output row for V blocks from ob0: blocks of 16/V pixels, then the remaining pixels.
template <int V>
void row(const Int8ConvArgs& g, const uint8_t* xrow, int64_t ob0, int64_t yrow) {
  constexpr int P = 16 / V;
  static constexpr std::array<BlockFn, P> tail = tails<V>(std::make_integer_sequence<int, P>{});
  int64_t ow = 0;
  for (; ow + P <= g.OW; ow += P) block<V, P>(g, xrow + ow * g.SW * g.Cp, ob0, yrow + ow * g.O);
  if (ow < g.OW) tail[g.OW - ow - 1](g, xrow + ow * g.SW * g.Cp, ob0, yrow + ow * g.O);
}

}  // namespace

void int8_conv_rows_avx512_vnni(const Int8ConvArgs& g, int64_t row_begin, int64_t row_end) {
  const auto* x = static_cast<const uint8_t*>(g.x);
  const int64_t OB = (g.O + 15) / 16;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t n = r / g.OH, oh = r % g.OH;
    const uint8_t* xrow = x + (n * g.Hp + oh * g.SH) * g.Wp * g.Cp;
    const int64_t yrow = r * g.OW * g.O;
    for (int64_t ob = 0; ob < OB;) {
      if (OB - ob >= 4) {
        row<4>(g, xrow, ob, yrow);
        ob += 4;
      } else if (OB - ob >= 2) {
        row<2>(g, xrow, ob, yrow);
        ob += 2;
      } else {
        row<1>(g, xrow, ob, yrow);
        ob += 1;
      }
    }
  }
}

void int8_add_avx512_vnni(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, float ma, float mb, float c,
                          int32_t lo) {
  const __m512 vma = _mm512_set1_ps(ma), vmb = _mm512_set1_ps(mb), vc = _mm512_set1_ps(c);
  const __m512 fmin = _mm512_set1_ps(-1.0f), fmax = _mm512_set1_ps(256.0f);
  const __m512i ilo = _mm512_set1_epi32(lo), ihi = _mm512_set1_epi32(255);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1u);
    const __m512 fa = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, a + i)));
    const __m512 fb = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, b + i)));
    const __m512 s = _mm512_add_ps(_mm512_mul_ps(fa, vma), _mm512_mul_ps(fb, vmb));
    const __m512 u = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(s, vc), fmin), fmax);
    const __m512i q = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(u), ilo), ihi);
    _mm_mask_storeu_epi8(y + i, mask, _mm512_cvtepi32_epi8(q));
  }
}

}  // namespace whittle::kernels::detail
