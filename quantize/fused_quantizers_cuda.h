#pragma once
// The CUDA side of quantize/fused_quantizers.h, called by it for CUDA tensors once it has checked
// the arguments (contiguous float32, bit widths, clip, sizes): same contracts, results on the
// input's device, kernels on the current CUDA stream. Built only with WHITTLE_CUDA.

#include <ATen/Tensor.h>

#include <cstdint>
#include <utility>

#include "quantize/fused_quantizers.h"

namespace whittle::quantize::fused::cuda {

MaskedOutput dorefa_activation(const at::Tensor& x, int64_t bits, double clip, bool with_mask, bool after_relu);
MaskedOutput sign(const at::Tensor& x, bool with_mask);
at::Tensor mask_multiply(const at::Tensor& grad, const at::Tensor& mask);
at::Tensor abs_max(const at::Tensor& t, bool per_channel, int64_t axis);
at::Tensor dorefa_weight_values(const at::Tensor& t, const at::Tensor& m, int64_t bits, int64_t axis);
at::Tensor dorefa_weight_grad(const at::Tensor& grad, const at::Tensor& t, const at::Tensor& m, int64_t axis);
at::Tensor ternary_values(const at::Tensor& w, const at::Tensor& delta, const at::Tensor& alpha, int64_t axis);

/// LSQ (Esser et al. 2020) on a CUDA tensor, the values of quantize::lsq_quantize's ATen form on
/// the GPU: x contiguous float32; `step` float32 on x's device with 1 element or x.size(axis) (a
/// step per channel along `axis`), already at its floor; `offset` one float32 element (LSQ+) or
/// undefined. Throws whittle::Error for a step or offset of another size.
at::Tensor lsq(const at::Tensor& x, const at::Tensor& step, const at::Tensor& offset, int64_t q_n, int64_t q_p,
               int64_t axis);

/// The per-element terms of LSQ's backward (quantize_cuda_bodies.h, lsq_grad_terms), each of x's
/// shape: the input gradient, the step's terms and the offset's (undefined without an offset). The
/// step and offset gradients are their sums (over the step's channel), before the gradient scale,
/// as the ATen form sums its own products.
struct LsqTerms {
  at::Tensor input, step, offset;
};
LsqTerms lsq_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& step, const at::Tensor& offset,
                      int64_t q_n, int64_t q_p, int64_t axis);

/// PACT (Choi et al. 2018) on a CUDA tensor: round(min(max(x, 0), α)/s)·s with α and s one float32
/// element each on x's device, the values of PACT's ATen form on the GPU.
at::Tensor pact(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& step);

/// PACT's backward terms, each of x's shape: the input gradient and α's terms (α's gradient is
/// their sum).
std::pair<at::Tensor, at::Tensor> pact_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& alpha,
                                                bool after_relu);

}  // namespace whittle::quantize::fused::cuda
