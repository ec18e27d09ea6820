#pragma once
// The bitpacked kernels on CUDA tensors: the ATen side of kernels/kernels_cuda.cu (allocation on
// the input's device, the launch on its current stream). Called by the public functions of
// bitpack.h, binary_conv.h and bitplane.h after they have checked their arguments, for inputs on
// a CUDA device; compiled only where whittle is built with WHITTLE_CUDA (WHITTLE_WITH_CUDA).

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>

#include "kernels/binary_conv.h"
#include "kernels/bitpack.h"
#include "kernels/bitplane.h"
#include "kernels/cuda_bodies.h"

namespace whittle::kernels::detail {

/// Throws whittle::Error naming `what` when `t` is on a device the kernels do not run on: neither
/// the CPU nor (in a build with WHITTLE_CUDA) a CUDA device.
void check_kernel_device(const at::Tensor& t, const std::string& what);

/// The CPU kernels' shape of a convolution on packed input [N, H, W, Cw] (a linear layer: H = W = 1).
cuda_body::ConvShape conv_shape(int64_t N, int64_t H, int64_t W, const PackedBinaryWeight& w,
                                const BinaryConv2dOptions& opt, int64_t Ho, int64_t Wo);

namespace cuda {

/// pack_signs of a CUDA floating tensor [N, C] or [N, C, H, W].
at::Tensor pack_signs(const at::Tensor& x);
/// pack_bitplanes of CUDA codes; throws whittle::Error (after the kernel) for a code out of range.
at::Tensor pack_bitplanes(const at::Tensor& codes, int64_t bits);
/// max_pool2d_signs of CUDA words [N, H, W, Cw] into [N, Ho, Wo, Cw].
at::Tensor max_pool2d_signs(const at::Tensor& packed, const SignPool2dOptions& o, int64_t Ho, int64_t Wo);

/// What binary_conv writes (kernels_cuda.h's BinaryOutputKind).
enum class Output { kDot, kFloat, kSign };

/// A binary convolution or linear layer on CUDA: x contiguous int64 words on the weight's device,
/// the epilogue vectors float [O] there (undefined for kDot; threshold and direction for kSign).
/// Returns int32 or float [N, O, Ho, Wo], or int64 [N, Ho, Wo, ⌈O/64⌉] words (reshaped by the
/// caller for a linear layer).
at::Tensor binary_conv(const at::Tensor& x, const PackedBinaryWeight& w, const cuda_body::ConvShape& s, Output kind,
                       const at::Tensor& scale, const at::Tensor& bias, const at::Tensor& threshold,
                       const at::Tensor& direction);

/// Caps the CUDA launches at `max_blocks` blocks (0: the default) and returns the previous cap
/// (kernels_cuda.h; for tests of the grid-stride loops).
unsigned set_grid_limit(unsigned max_blocks);

/// A bit-plane convolution or linear layer on CUDA: planes contiguous int64 [P, N, H, W, Cw],
/// scale and bias float [O] on their device; float [N, O, Ho, Wo].
at::Tensor bitplane_conv(const at::Tensor& planes, const PackedBitplaneWeight& w, const cuda_body::ConvShape& s,
                         const at::Tensor& scale, const at::Tensor& bias);

}  // namespace cuda
}  // namespace whittle::kernels::detail
