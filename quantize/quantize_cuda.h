#pragma once
// CUDA launchers of the fused quantizer kernels (quantize/fused_quantizers.h) on device pointers:
// plain CUDA, no LibTorch (quantize_cuda.cu, compiled by nvcc with -fmad=false so that every
// product and sum rounds on its own, as ATen's one-op-a-kernel forms do). They give the bits of
// the ATen-op forms on CUDA, which divide by a scalar as a multiplication by its float reciprocal:
// so DoReFa values with a clip or level count whose reciprocal is inexact may differ from the CPU
// kernels' (true division) in the last bits, and, for a clip level whose reciprocal is inexact, an
// activation whose x/c·n lies within an ulp of a rounding midpoint may take the next level, as
// ATen's own CPU and CUDA results do. Each launcher enqueues its kernel on `stream` (a
// cudaStream_t) and returns the CUDA error code of the launch (0 on success);
// quantize_cuda_error_string names a code. The element-wise semantics are those of
// quantize/quantize_simd.h, the mask layout that of fused_quantizers.h (element i at bit i mod 8
// of byte i / 8, bits past n zero). What each thread computes is in quantize_cuda_bodies.h.

#include <cstdint>

#include "quantize/quantize_cuda_bodies.h"

namespace whittle::quantize::detail {

/// y[i] = DoReFa activation of x[i] at `bits` (1..16): clip(x, 0, c)·(1/c), round(·n)·(1/n), ·c
/// with n = 2^bits − 1 (without the two c steps when c = 1), mask as
/// QuantizeSimd::dorefa_activation; `mask` may be null. n ≥ 0.
int dorefa_activation_cuda(const float* x, float* y, uint8_t* mask, int64_t n, float clip, int bits, bool after_relu,
                           void* stream);

/// y[i] = x[i] ≥ 0 ? +1 : −1 (NaN: −1); mask bit i = |x[i]| ≤ 1; `mask` may be null.
int sign_cuda(const float* x, float* y, uint8_t* mask, int64_t n, void* stream);

/// dx[i] = g[i] · (mask bit i ? 1 : 0).
int mask_multiply_cuda(const float* g, const uint8_t* mask, float* dx, int64_t n, void* stream);

/// A weight seen as [outer, channels, inner] around its channel axis (quantize_cuda_bodies.h).
using CudaChannelView = cuda_body::ChannelView;

/// dst[i] = clamp(round((t[i]/(2m_c) + 1/2)·n), 0, n)·(1/n)·2 − 1 with n = 2^bits − 1 (bits 2..8).
int dorefa_weight_values_cuda(const float* t, const float* m, float* dst, CudaChannelView v, int bits, void* stream);

/// dst[i] = g[i]·(1 − t[i]²)/m_c.
int dorefa_weight_grad_cuda(const float* g, const float* t, const float* m, float* dst, CudaChannelView v, void* stream);

/// dst[i] = (([w > Δ_c] − [w < −Δ_c] + 1) − 1)·α_c; Δ and α each per channel or shared
/// (`per_channel_delta`, `per_channel_alpha`; the view's per_channel is not read).
int ternary_values_cuda(const float* w, const float* delta, const float* alpha, float* dst, CudaChannelView v,
                        bool per_channel_delta, bool per_channel_alpha, void* stream);

/// y[i] = LSQ value of x[i] (cuda_body::lsq_value): `steps` on the device, one element or one per
/// channel of v (v.per_channel), already at their floor; `offset` a device pointer to one element
/// (LSQ+) or null; grid [lo, hi] = [−q_n, q_p].
int lsq_cuda(const float* x, const float* steps, const float* offset, float* y, CudaChannelView v, float lo, float hi,
             void* stream);

/// LSQ's backward terms (cuda_body::lsq_grad_terms) for the upstream gradient g: dx, the step's
/// terms and, when `offset_terms` is non-null, the offset's; all x's element count.
int lsq_backward_cuda(const float* g, const float* x, const float* steps, const float* offset, float* dx,
                      float* step_terms, float* offset_terms, CudaChannelView v, float lo, float hi, void* stream);

/// y[i] = PACT value of x[i] (cuda_body::pact_value); α and s one device element each.
int pact_cuda(const float* x, const float* alpha, const float* step, float* y, int64_t n, void* stream);

/// PACT's backward terms (cuda_body::pact_grad_terms): dx and α's terms, n elements each.
int pact_backward_cuda(const float* g, const float* x, const float* alpha, float* dx, float* alpha_terms, int64_t n,
                       bool after_relu, void* stream);

/// Caps the blocks of every launch at `max_blocks` (0, or more than 2^31 − 1, restores the default
/// 2^31 − 1, CUDA's largest grid) and returns the previous cap: a test with a small cap runs every
/// grid-stride loop more than once. Not thread-safe; for tests.
unsigned set_quantize_cuda_grid_limit(unsigned max_blocks);

/// cudaGetErrorString of a code returned above.
const char* quantize_cuda_error_string(int code);

}  // namespace whittle::quantize::detail
