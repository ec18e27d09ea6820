#pragma once
// The per-element work of the CUDA fused quantizer kernels (quantize/quantize_cuda.cu): what one
// GPU thread computes, written once as __host__ __device__ functions of plain values, pointers and
// indices, so that the kernels are grid-stride loops (core/cuda_grid.h) over them and the same
// code runs on the host in tests (tests/fused_quantizers_test.cpp, CudaQuantizerBodies.*, runs every body over every
// element on any machine). No LibTorch, no CUDA runtime.
//
// Rounding: every product, quotient and sum rounds on its own, as in ATen's one-op-a-kernel CUDA
// forms: the device code calls __fmul_rn and friends (and nvcc runs with -fmad=false); the host
// code uses plain float operators, which round each operation as long as the compiler does not
// contract them (tests compile with -ffp-contract=off). ATen's CUDA division by a scalar multiplies
// by the scalar's float reciprocal (BinaryDivTrueKernel.cu), so the bodies take reciprocals where
// the ATen-op form divides by a scalar (the clip level, the number of levels).
//
// Mask layout (fused_quantizers.h): element i at bit i mod 8 of byte i / 8; bits past n are zero.

#include <cmath>
#include <cstdint>

#include "core/cuda_grid.h"  // WHITTLE_HD; the kernels' loops are cuda_grid's

namespace whittle::quantize::cuda_body {

/// a·b, a/b, a+b, a−b, each rounded to nearest even on its own.
WHITTLE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
WHITTLE_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
WHITTLE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
WHITTLE_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

/// Round half to even (rintf under the default rounding mode on both sides).
WHITTLE_HD float round_even(float x) { return rintf(x); }

/// std::min(std::max(x, 0), c) with std's NaN behaviour (the first argument wins a comparison
/// with NaN, so NaN stays NaN), not fminf/fmaxf's (which drop the NaN).
WHITTLE_HD float clip_like_std(float x, float c) {
  const float t = (x < 0.0f) ? 0.0f : x;
  return (c < t) ? c : t;
}

/// DoReFa activation value as the ATen-op form computes it on CUDA: clamp(x, 0, c)·(1/c), then
/// round(·n)·(1/n), then ·c; without the two c steps when `unit_clip` (c = 1). `inv_clip` and
/// `inv_levels` are 1/c and 1/n in float.
WHITTLE_HD float dorefa_value(float x, float clip, float inv_clip, float levels, float inv_levels, bool unit_clip) {
  float t = clip_like_std(x, clip);
  if (!unit_clip) t = mul_rn(t, inv_clip);
  float q = mul_rn(round_even(mul_rn(t, levels)), inv_levels);
  if (!unit_clip) q = mul_rn(q, clip);
  return q;
}

/// DoReFa activation (Zhou et al. 2016) of one element; the gradient passes on [0, clip], or on
/// (0, clip] after a folded ReLU (the ReLU's gradient is 0 at 0).
struct DoReFaActivationOp {
  float clip, inv_clip, levels, inv_levels;
  bool unit_clip, after_relu;
  WHITTLE_HD float value(float v) const { return dorefa_value(v, clip, inv_clip, levels, inv_levels, unit_clip); }
  WHITTLE_HD bool pass(float v) const { return (after_relu ? v > 0.0f : v >= 0.0f) && v <= clip; }
};

/// BNN sign (Courbariaux et al. 2016; sign(0) = +1, NaN → −1); the straight-through gradient
/// passes where |x| ≤ 1 (NaN: blocked).
struct SignOp {
  WHITTLE_HD float value(float v) const { return v >= 0.0f ? 1.0f : -1.0f; }
  WHITTLE_HD bool pass(float v) const { return fabsf(v) <= 1.0f; }
};

/// DoReFa's number of levels above zero, n = 2^bits − 1, as a float (bits 1..16).
WHITTLE_HD float dorefa_levels(int bits) { return static_cast<float>((int64_t{1} << bits) - 1); }

/// The DoReFa activation op of a launch: clip level c, `bits`, reciprocals formed as ATen's CUDA
/// division by a scalar forms them (1/c and 1/n in float); c = 1 skips the two c steps, which
/// multiply by 1 exactly.
WHITTLE_HD DoReFaActivationOp dorefa_activation_op(float clip, int bits, bool after_relu) {
  const float levels = dorefa_levels(bits);
  return {clip, 1.0f / clip, levels, 1.0f / levels, clip == 1.0f, after_relu};
}

/// One lane of a masked kernel at element i: for i < n writes y[i] = op.value(x[i]) and returns
/// op.pass(x[i]); past n writes nothing and returns false (so the ballot's bits past n are 0).
template <class Op>
WHITTLE_HD bool masked_lane(const float* x, float* y, int64_t n, int64_t i, const Op& op) {
  if (i >= n) return false;
  const float v = x[i];
  y[i] = op.value(v);
  return op.pass(v);
}

/// Stores the 32 mask bits of the elements base .. base + 31 (bit k: element base + k; `base` a
/// multiple of 32) as the mask bytes base/8 .. base/8 + 3 that exist for n elements (⌈n/8⌉
/// bytes). Bits past n must already be 0.
WHITTLE_HD void store_mask_word(uint8_t* mask, int64_t base, int64_t n, uint32_t bits) {
  const int64_t bytes = (n + 7) / 8;
  for (int b = 0; b < 4; ++b) {
    const int64_t at = base / 8 + b;
    if (at < bytes) mask[at] = static_cast<uint8_t>(bits >> (8 * b));
  }
}

/// The warp's mask word, stored by its first lane (lane 0) when a mask was asked for (mask non-null).
WHITTLE_HD void store_warp_mask(uint8_t* mask, int64_t lane, int64_t base, int64_t n, uint32_t bits) {
  if (mask != nullptr && lane == 0) store_mask_word(mask, base, n, bits);
}

/// g·(mask bit i ? 1 : 0): the STE backward of a masked quantizer at element i (a NaN or infinite
/// gradient where the mask is 0 gives NaN, as ATen's g·mask does).
WHITTLE_HD float mask_multiply_value(const float* g, const uint8_t* mask, int64_t i) {
  return mul_rn(g[i], ((mask[i / 8] >> (i % 8)) & 1u) ? 1.0f : 0.0f);
}

/// A weight seen as [outer, channels, inner] around its channel axis; a per-channel vector has
/// `channels` entries or one (then shared).
struct ChannelView {
  int64_t outer = 1, channels = 1, inner = 1;
  bool per_channel = false;
};

/// The view of a contiguous tensor of `dim` sizes around its channel axis `axis`.
WHITTLE_HD ChannelView channel_view(const int64_t* sizes, int64_t dim, int64_t axis, bool per_channel) {
  ChannelView v;
  for (int64_t d = 0; d < axis; ++d) v.outer *= sizes[d];
  v.channels = sizes[axis];
  for (int64_t d = axis + 1; d < dim; ++d) v.inner *= sizes[d];
  v.per_channel = per_channel;
  return v;
}

/// The channel of flat element i of a contiguous weight seen through v.
WHITTLE_HD int64_t channel_of(int64_t i, const ChannelView& v) { return (i / v.inner) % v.channels; }

/// The entry of a per-channel vector for element i: values[c] of i's channel c when v.per_channel,
/// values[0] otherwise.
WHITTLE_HD float channel_value(const float* values, const ChannelView& v, int64_t i) {
  return values[v.per_channel ? channel_of(i, v) : 0];
}

/// DoReFa weight value of element i (Zhou et al. 2016, eq. 9): t = tanh(w), m_c = max|t| of its
/// channel (or of the tensor); clamp(round((t/(2m_c) + 1/2)·n), 0, n)·(1/n)·2 − 1 with
/// n = levels = 2^bits − 1 and `inv_levels` = 1/n in float.
WHITTLE_HD float dorefa_weight_value(const float* t, const float* m, const ChannelView& v, float levels,
                                      float inv_levels, int64_t i) {
  const float m2 = mul_rn(channel_value(m, v, i), 2.0f);
  float code = round_even(mul_rn(add_rn(div_rn(t[i], m2), 0.5f), levels));
  code = (code < 0.0f) ? 0.0f : code;  // std::max(code, 0), then std::min(·, levels)
  code = (levels < code) ? levels : code;
  return sub_rn(mul_rn(mul_rn(code, inv_levels), 2.0f), 1.0f);
}

/// Gradient of the DoReFa weight value with respect to w at element i, through tanh and the
/// straight-through rounding: g·(1 − t²)/m_c.
WHITTLE_HD float dorefa_weight_grad_value(const float* g, const float* t, const float* m, const ChannelView& v,
                                           int64_t i) {
  const float mc = channel_value(m, v, i);
  return div_rn(mul_rn(g[i], sub_rn(1.0f, mul_rn(t[i], t[i]))), mc);
}

/// TWN ternary value of element i (Li et al. 2016): ([w > Δ_c] − [w < −Δ_c])·α_c, computed as the
/// ATen-op form does, through the code (… + 1) − 1; Δ and α each per channel or shared.
WHITTLE_HD float ternary_value(const float* w, const float* delta, const float* alpha, const ChannelView& v,
                                bool per_channel_delta, bool per_channel_alpha, int64_t i) {
  const int64_t c = channel_of(i, v);
  const float d = delta[per_channel_delta ? c : 0], a = alpha[per_channel_alpha ? c : 0];
  const float code = (w[i] > d ? 1.0f : 0.0f) - (w[i] < -d ? 1.0f : 0.0f) + 1.0f;
  return mul_rn(code - 1.0f, a);
}

/// max(v, lo) and min(v, hi) as ATen's clamp, clamp_min and minimum compute them after their NaN
/// checks: ::fmaxf/::fminf on the device (ATen's CUDA ::max/::min, for which −0 < +0 may hold),
/// std::max/std::min on the host (ATen's CPU forms, which keep v's zero on a tie of zeros). The two
/// differ only in the sign of a zero result.
WHITTLE_HD float max_like_aten(float v, float lo) {
#if defined(__CUDA_ARCH__)
  return fmaxf(v, lo);
#else
  return (v < lo) ? lo : v;
#endif
}
WHITTLE_HD float min_like_aten(float v, float hi) {
#if defined(__CUDA_ARCH__)
  return fminf(v, hi);
#else
  return (hi < v) ? hi : v;
#endif
}

/// ATen's clamp(v, lo, hi): NaN stays NaN, else min(max(v, lo), hi) as above.
WHITTLE_HD float clamp_keep_nan(float v, float lo, float hi) {
  if (v != v) return v;
  return min_like_aten(max_like_aten(v, lo), hi);
}

/// (x − b)/s of LSQ, or x/s without an offset (`offset` null): the ATen form's quotient by a step
/// tensor on the device, a true division on CUDA as on the CPU.
WHITTLE_HD float lsq_scaled(float x, float s, const float* offset) {
  return div_rn(offset != nullptr ? sub_rn(x, offset[0]) : x, s);
}

/// LSQ (Esser et al. 2020) value of element i, as quantize::lsq_quantize's ATen form computes it:
/// round(clamp((x − b)/s, −q_n, q_p))·s (+ b with an offset, LSQ+), rounding half to even; s the
/// step of i's channel (already at its floor), b = offset[0] or none (`offset` null);
/// lo = −q_n, hi = q_p.
WHITTLE_HD float lsq_value(const float* x, const float* steps, const float* offset, const ChannelView& v, float lo,
                           float hi, int64_t i) {
  const float s = channel_value(steps, v, i);
  const float y = mul_rn(round_even(clamp_keep_nan(lsq_scaled(x[i], s, offset), lo, hi)), s);
  return offset != nullptr ? add_rn(y, offset[0]) : y;
}

/// LSQ's backward at element i for the upstream gradient g, the terms of the ATen form (each
/// rounded as its own product): the input's g·[−q_n < v < q_p]; the step's g·(round(v) − v) inside,
/// g·(−q_n) below, g·q_p above; the offset's g·[outside]. The step and offset gradients are the
/// sums of those terms over the step's channel (or the tensor), before LSQ's gradient scale.
struct LsqGradTerms {
  float input, step, offset;
};
WHITTLE_HD LsqGradTerms lsq_grad_terms(const float* g, const float* x, const float* steps, const float* offset,
                                       const ChannelView& v, float lo, float hi, int64_t i) {
  const float s = channel_value(steps, v, i);
  const float q = lsq_scaled(x[i], s, offset);
  const bool below = q <= lo, above = q >= hi, inside = !below && !above;
  const float ds = inside ? sub_rn(round_even(q), q) : (below ? lo : hi);
  return {mul_rn(g[i], inside ? 1.0f : 0.0f), mul_rn(g[i], ds), mul_rn(g[i], inside ? 0.0f : 1.0f)};
}

/// PACT (Choi et al. 2018) value of element i as its ATen form computes it:
/// round(minimum(clamp_min(x, 0), α)/s)·s, NaN kept (from x or α); α = alpha[0], s = step[0] (the
/// forward's α/(2^k − 1) in float).
WHITTLE_HD float pact_value(const float* x, const float* alpha, const float* step, int64_t i) {
  const float v = x[i];
  float t = (v != v) ? v : max_like_aten(v, 0.0f);  // clamp_min(x, 0)
  const float a = alpha[0];
  t = (t != t) ? t : ((a != a) ? a : min_like_aten(t, a));  // minimum(·, α)
  return mul_rn(round_even(div_rn(t, step[0])), step[0]);
}

/// PACT's backward at element i for the upstream gradient g: the input's g·[0 ≤ x < α] (0 < x
/// with `after_relu`: the ReLU's gradient at 0 is 0) and α's term g·[x ≥ α], each a product as in
/// the ATen form; α's gradient is the sum of the terms.
struct PactGradTerms {
  float input, alpha;
};
WHITTLE_HD PactGradTerms pact_grad_terms(const float* g, const float* x, const float* alpha, bool after_relu,
                                         int64_t i) {
  const float v = x[i];
  const bool low = after_relu ? v > 0.0f : v >= 0.0f;
  const bool above = v >= alpha[0];
  return {mul_rn(g[i], (low && !above) ? 1.0f : 0.0f), mul_rn(g[i], above ? 1.0f : 0.0f)};
}

}  // namespace whittle::quantize::cuda_body
