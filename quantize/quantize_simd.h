#pragma once
// Element-wise microkernels of the fused activation quantizers (quantize/fused_quantizers.h):
// plain C++ with intrinsics, no LibTorch, each instruction-set variant compiled in its own unit
// with its own target flags (quantize/CMakeLists.txt) and chosen at run time (core/isa.h), as
// the popcount GEMMs of kernels/ are. Every variant computes exactly the same values: the same float
// operations in the same order (no fused multiply-add: the units are compiled with
// -ffp-contract=off), rounding half to even.
//
// Masks: one bit an element, least significant bit first (element i is bit i mod 8 of byte i / 8),
// bits past n zero. A kernel called on part of a tensor starts at an element index that is a
// multiple of 8, so that its mask bytes are its own.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace whittle::quantize::detail {

/// The DoReFa activation of one value: c·round(clip(x, 0, c)/c · n)/n, or round(clip(x, 0, 1)·n)/n
/// when `unit_clip` (c = 1, the paper's form, without the two scalings); NaN stays NaN.
inline float dorefa_activation_value(float x, float clip, float levels, bool unit_clip) {
  float t = std::min(std::max(x, 0.0f), clip);  // NaN: std::max and std::min return their first argument
  if (!unit_clip) t = t / clip;
  float q = std::nearbyint(t * levels) / levels;
  if (!unit_clip) q = q * clip;
  return q;
}

/// Kernel table of one instruction set. n ≥ 0 elements, contiguous; `mask` may be null (no mask
/// written).
struct QuantizeSimd {
  /// y[i] = dorefa_activation_value(x[i]); mask bit i = (0 ≤ x[i] ≤ clip), or (0 < x[i] ≤ clip) when
  /// `after_relu` (the quantizer stands for ReLU then quantizer: ReLU's gradient is 0 at x = 0);
  /// false for NaN.
  void (*dorefa_activation)(const float* x, float* y, uint8_t* mask, int64_t n, float clip, float levels,
                            bool unit_clip, bool after_relu);
  /// y[i] = x[i] ≥ 0 ? +1 : −1 (NaN: −1); mask bit i = (|x[i]| ≤ 1) (false for NaN).
  void (*sign)(const float* x, float* y, uint8_t* mask, int64_t n);
  /// dx[i] = g[i] · (mask bit i ? 1.0f : 0.0f): the product, as ATen's grad * bool mask gives it
  /// (a NaN or infinite g times 0 is NaN).
  void (*mask_multiply)(const float* g, const uint8_t* mask, float* dx, int64_t n);
  /// The LSQ backward over n elements (quantize/lsq.h), v = (x[i] − b)/s: dx[i] = g[i] where
  /// lo < v < hi (NaN counts inside, as the ATen form's comparisons give), 0 elsewhere; and, element
  /// i into lane i mod kLsqLanes, ds[lane] += g[i]·(round(v) − v inside, lo at or below, hi at or
  /// above) and db[lane] += (inside ? 0 : g[i]), in float, in element order per lane (every variant
  /// gives the same sums).
  void (*lsq_backward)(const float* x, const float* g, float* dx, int64_t n, float s, float b, float lo, float hi,
                       float* ds, float* db);
};

/// Lanes of QuantizeSimd::lsq_backward's sums.
constexpr int kLsqLanes = 8;

/// round(v) half to even for |v| ≤ 2^22 by float arithmetic (the sum's rounding does it; NaN stays
/// NaN); the values of nearbyint there.
inline float round_half_even_small(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5·2^23
  return (v + kMagic) - kMagic;
}

inline void lsq_backward_tail(const float* x, const float* g, float* dx, int64_t begin, int64_t n, float s, float b,
                              float lo, float hi, float* ds, float* db) {
  for (int64_t i = begin; i < n; ++i) {
    const float v = (x[i] - b) / s;
    const bool below = v <= lo, above = v >= hi;
    const bool inside = !(below || above);
    dx[i] = inside ? g[i] : 0.0f;
    const int lane = static_cast<int>(i % kLsqLanes);
    // Outside the range round_half_even_small's value (for |v| > 2^22) is not used.
    ds[lane] += g[i] * (inside ? round_half_even_small(v) - v : (below ? lo : hi));
    db[lane] += inside ? 0.0f : g[i];
  }
}

#if defined(__x86_64__) || defined(_M_X64)
/// The AVX2 lsq_backward, which the AVX-512 table uses too (eight lanes in every variant).
void lsq_backward_avx2(const float* x, const float* g, float* dx, int64_t n, float s, float b, float lo, float hi,
                       float* ds, float* db);
#endif

extern const QuantizeSimd kQuantizeSimdScalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const QuantizeSimd kQuantizeSimdAvx2;
extern const QuantizeSimd kQuantizeSimdAvx512;
#endif

/// The table of core/isa.h's active_isa().
const QuantizeSimd& quantize_simd();

// ---- the scalar loops every variant uses for what is left past its last full vector

inline void dorefa_activation_tail(const float* x, float* y, uint8_t* mask, int64_t begin, int64_t n, float clip,
                                   float levels, bool unit_clip, bool after_relu) {
  for (int64_t i = begin; i < n; ++i) {
    y[i] = dorefa_activation_value(x[i], clip, levels, unit_clip);
    if (mask) {
      if (i % 8 == 0) mask[i / 8] = 0;
      if ((after_relu ? x[i] > 0.0f : x[i] >= 0.0f) && x[i] <= clip) mask[i / 8] = static_cast<uint8_t>(mask[i / 8] | (1u << (i % 8)));
    }
  }
}

inline void sign_tail(const float* x, float* y, uint8_t* mask, int64_t begin, int64_t n) {
  for (int64_t i = begin; i < n; ++i) {
    y[i] = x[i] >= 0.0f ? 1.0f : -1.0f;
    if (mask) {
      if (i % 8 == 0) mask[i / 8] = 0;
      if (std::fabs(x[i]) <= 1.0f) mask[i / 8] = static_cast<uint8_t>(mask[i / 8] | (1u << (i % 8)));
    }
  }
}

inline void mask_multiply_tail(const float* g, const uint8_t* mask, float* dx, int64_t begin, int64_t n) {
  for (int64_t i = begin; i < n; ++i) dx[i] = g[i] * (((mask[i / 8] >> (i % 8)) & 1u) ? 1.0f : 0.0f);
}

}  // namespace whittle::quantize::detail
