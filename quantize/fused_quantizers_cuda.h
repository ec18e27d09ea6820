#pragma once
// The CUDA side of quantize/fused_quantizers.h, called by it for CUDA tensors once it has checked
// the arguments (contiguous float32, bit widths, clip, sizes): same contracts, results on the
// input's device, kernels on the current CUDA stream. Built only with WHITTLE_CUDA.

#include <ATen/Tensor.h>

#include <cstdint>

#include "quantize/fused_quantizers.h"

namespace whittle::quantize::fused::cuda {

MaskedOutput dorefa_activation(const at::Tensor& x, int64_t bits, double clip, bool with_mask, bool after_relu);
MaskedOutput sign(const at::Tensor& x, bool with_mask);
at::Tensor mask_multiply(const at::Tensor& grad, const at::Tensor& mask);
at::Tensor abs_max(const at::Tensor& t, bool per_channel, int64_t axis);
at::Tensor dorefa_weight_values(const at::Tensor& t, const at::Tensor& m, int64_t bits, int64_t axis);
at::Tensor dorefa_weight_grad(const at::Tensor& grad, const at::Tensor& t, const at::Tensor& m, int64_t axis);
at::Tensor ternary_values(const at::Tensor& w, const at::Tensor& delta, const at::Tensor& alpha, int64_t axis);

}  // namespace whittle::quantize::fused::cuda
