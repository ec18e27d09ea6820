#pragma once
// Fused quantizer kernels of quantization-aware training: each quantizer of quantize/quantizers.h
// as one pass over its tensor forward, writing with the output the smallest thing the backward
// needs (a bit mask, one bit an element), and one pass backward. Same values as the ATen-op
// forms in quantize/quantizers.cpp: the same float operations in the same order, rounding half to
// even; equal as values (NaN is NaN; the sign of a zero result may differ, as it already does
// between ATen's own vector and scalar loops).
//
// Float32 contiguous tensors (fused_supported) on the CPU, and on CUDA devices in a build with
// WHITTLE_CUDA; the callers (quantize/quantizers.cpp) keep the ATen-op forms for everything else
// (other dtypes and layouts, and CUDA unless quantize::fused_quantizers_cuda_enabled()). On the
// CPU multi-threaded over blocks of elements (activations) or output channels (weights) with
// ATen's intra-op thread pool, the element-wise loops vectorized per instruction set
// (quantize/quantize_simd.h, chosen by core/isa.h). On CUDA one thread an element on the current
// stream (quantize/quantize_cuda.h), with the values of the ATen-op forms on the GPU, which may
// differ from the CPU's in the last bits, or, for a clip level whose reciprocal is inexact, by one
// level for an activation within an ulp of a rounding midpoint (ATen's CUDA division by a scalar
// multiplies by its reciprocal); results stay on the input's device.
//
// Mask layout: uint8 [⌈n/8⌉], element i (in the tensor's contiguous order) at bit i mod 8 of byte
// i / 8, least significant bit first; bits past n are 0.
//
// Methods: DoReFa (Zhou et al., 2016, arXiv:1606.06160), BNN (Hubara et al., 2016,
// arXiv:1602.02830), TWN (Li & Liu, 2016, arXiv:1605.04711), LSQ (Esser et al., 2020,
// arXiv:1902.08153; CPU only, one step per tensor).

#include <ATen/Tensor.h>

#include <cstdint>
#include <utility>

namespace whittle::quantize::fused {

/// Whether the fused kernels take `t`: a defined, contiguous float32 tensor on the CPU, or on a
/// CUDA device in a build with WHITTLE_CUDA.
bool fused_supported(const at::Tensor& t);

/// A quantized tensor and the mask its straight-through gradient needs.
struct MaskedOutput {
  at::Tensor output;  ///< same shape as the input, float32
  at::Tensor mask;    ///< uint8 [⌈n/8⌉] (layout above); undefined when not asked for
};

/// DoReFa activation c·round(clip(x, 0, c)/c·(2^bits − 1))/(2^bits − 1) (c = `clip`; for c = 1
/// round(clip(x, 0, 1)·(2^bits − 1))/(2^bits − 1) exactly), with, when `with_mask`, the mask of
/// 0 ≤ x ≤ c (the elements whose gradient passes), or of 0 < x ≤ c when `after_relu` (the
/// quantizer of relu(x): the same values, and ReLU's zero gradient at x = 0). bits 1..16; x as
/// fused_supported. Throws whittle::Error for another tensor, bit width or a clip that is not
/// finite and > 0.
MaskedOutput dorefa_activation(const at::Tensor& x, int64_t bits, double clip, bool with_mask, bool after_relu = false);

/// BNN sign: +1 where x ≥ 0 (−0.0 included), −1 elsewhere (NaN too), with, when `with_mask`, the
/// mask of |x| ≤ 1 (BNN's straight-through gradient). Throws whittle::Error for a tensor that is
/// not fused_supported.
MaskedOutput sign(const at::Tensor& x, bool with_mask);

/// The backward of both: grad · mask (elements whose bit is 0 get grad · 0). `grad` any float
/// tensor of n elements (made contiguous float32), `mask` as returned for n elements. Returns
/// float32 of grad's shape. Throws whittle::Error when the sizes disagree.
at::Tensor mask_multiply(const at::Tensor& grad, const at::Tensor& mask);

/// max |t| per output channel along `axis` (float32 [C], C = t.size(axis)) or over the whole tensor
/// ([1]) when !per_channel; t as fused_supported. Exact (a maximum does not depend on the order).
/// Throws whittle::Error for an axis out of range or an empty tensor.
at::Tensor abs_max(const at::Tensor& t, bool per_channel, int64_t axis);

/// DoReFa weight values from t = tanh(w) and m = max|t| ([1] or [C] along `axis`, already clamped
/// away from 0): 2·round_clamped((t/(2m) + 1/2)·n)/n − 1 with n = 2^bits − 1, the decoding of
/// quantize::dorefa_encode's codes. bits 2..8. Throws whittle::Error for bad sizes.
at::Tensor dorefa_weight_values(const at::Tensor& t, const at::Tensor& m, int64_t bits, int64_t axis);

/// The DoReFa weight gradient grad·(1 − t²)/m (m broadcast along `axis` as above; the max held
/// constant, as DoReFa's straight-through estimator). Throws whittle::Error for bad sizes.
at::Tensor dorefa_weight_grad(const at::Tensor& grad, const at::Tensor& t, const at::Tensor& m, int64_t axis);

/// TWN weight values, the decoding of quantize::twn_encode's codes: (code − 1)·α with
/// code = [w > Δ] − [w < −Δ] + 1, so +α, 0 or −α; Δ and α float32 [1] or [C] along `axis`.
/// Throws whittle::Error for bad sizes.
at::Tensor ternary_values(const at::Tensor& w, const at::Tensor& delta, const at::Tensor& alpha, int64_t axis);

/// LSQ (Esser et al., 2020) with one step for the whole tensor, on the CPU: round(clamp((x − b)/s,
/// −q_n, q_p))·s + b (b = `offset` when `has_offset`, LSQ+; otherwise x/s and no addition), the
/// values of quantize::lsq_quantize's ATen form (rounding half to even; the sign of a zero result may
/// differ). `step` is the step already at its floor. Throws whittle::Error for a tensor that is not
/// a contiguous float32 CPU tensor or a grid with q_p ≤ 0 or q_n < 0.
at::Tensor lsq(const at::Tensor& x, float step, float offset, bool has_offset, int64_t q_n, int64_t q_p);

/// The gradients of lsq() for the upstream gradient `grad` (x's element count): the input's
/// (grad where −q_n < v < q_p, else 0, float32 of grad's shape), and the sums over the tensor of
/// grad·∂x̂/∂s (round(v) − v inside, the bound outside) and of grad·∂x̂/∂b (1 outside), before LSQ's
/// gradient scale. The sums are accumulated over fixed chunks (float lanes within a chunk, the
/// chunks in double, in order), so they do not depend on the thread count. Same errors as lsq().
struct LsqGradients {
  at::Tensor input;
  double step = 0.0;
  double offset = 0.0;
};
LsqGradients lsq_backward(const at::Tensor& grad, const at::Tensor& x, float step, float offset, bool has_offset,
                          int64_t q_n, int64_t q_p);

/// PACT (Choi et al., 2018) on the CPU: round(min(max(x, 0), a)/s)·s with s = `step` (α/(2^k − 1)
/// rounded to float) and a = `alpha`, the values of PACT's ATen form. Same errors as lsq().
at::Tensor pact(const at::Tensor& x, float alpha, float step);

/// The gradients of pact(): the input's (grad where 0 ≤ x < α, or 0 < x < α when `after_relu`) and
/// the sum of grad over x ≥ α (α's), accumulated as lsq_backward's sums.
std::pair<at::Tensor, double> pact_backward(const at::Tensor& grad, const at::Tensor& x, float alpha, bool after_relu);

}  // namespace whittle::quantize::fused
