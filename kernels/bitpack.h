#pragma once
// Bit packing of signs along channels, the input layout of the binary kernels (binary_conv.h).
//
// Layout: channel-last words. For a feature map [N, C, H, W] the packed tensor is int64
// [N, H, W, ⌈C/64⌉] (NHWC of 64-bit words); for a matrix [N, C] it is [N, ⌈C/64⌉]. Channel c sits in
// word c / 64 at bit c mod 64 (least significant bit first). A bit is 1 where the value is
// negative (or NaN), 0 where it is ≥ 0: sign(0) = +1, as the BNN binarizer (Hubara et al., 2016). Bits past
// C in the last word are 0. int64 holds the words because ATen has no general uint64 dtype; the
// kernels read them as uint64.

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>

namespace whittle::kernels {

/// 64-bit words needed for `channels` bits: ⌈channels / 64⌉.
inline int64_t words_for(int64_t channels) { return (channels + 63) / 64; }

/// Packs the signs of `x` (floating point; [N, C] or [N, C, H, W], any strides) into int64
/// [N, ⌈C/64⌉] or [N, H, W, ⌈C/64⌉] words on x's device, layout above. NaN packs as −1 (it is
/// not ≥ 0), as quantize::bnn_sign binarizes it. On the CPU multi-threaded over N·H·W; on a CUDA
/// device (a build with WHITTLE_CUDA) one thread a word (kernels/kernels_cuda.cu). Throws
/// whittle::Error for another rank, a non-floating dtype, or a device the kernels do not run on.
at::Tensor pack_signs(const at::Tensor& x);

/// Plain-loop reference of pack_signs (one bit at a time, on the CPU; the result on x's device);
/// same layout and errors.
at::Tensor pack_signs_reference(const at::Tensor& x);

/// The ±1 float tensor [N, C] or [N, C, H, W] that `packed` (pack_signs's layout) encodes, for
/// `channels` ≥ 1 channels, on packed's device. Throws whittle::Error when `packed` is not an
/// int64 tensor of rank 2 or 4 on the CPU or a CUDA device, its last dimension is not
/// ⌈channels/64⌉, or channels < 1.
at::Tensor unpack_signs(const at::Tensor& packed, int64_t channels);

/// Window of a max pooling over packed signs (dilation 1).
struct SignPool2dOptions {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
  bool ceil_mode = false;  ///< output size rounded up, as at::max_pool2d's ceil_mode
};

/// Max pooling of packed signs: `packed` int64 [N, H, W, ⌈C/64⌉] (pack_signs's layout) →
/// [N, Ho, Wo, ⌈C/64⌉], Ho and Wo as at::max_pool2d computes them. The max of ±1 values is −1
/// only where every one is −1, so each output word is the AND of the window's words; padded
/// positions are left out (max pooling pads with −∞). Equals pack_signs(at::max_pool2d(x)) for
/// x = unpack_signs(packed). On packed's device (CPU: multi-threaded over N·Ho; CUDA: one thread
/// a word). Throws whittle::Error for a tensor that is not int64 of rank 4 on the CPU or a CUDA
/// device, kernel or stride < 1, padding < 0 or above half the kernel, or a window larger than
/// the padded input.
at::Tensor max_pool2d_signs(const at::Tensor& packed, const SignPool2dOptions& options);

namespace detail {
/// pack_signs with `what` naming the caller in its errors (pack_binary_weight).
at::Tensor pack_signs_named(const at::Tensor& x, const std::string& what);
/// "[2, 3, 4]": a tensor's sizes, for error messages.
std::string sizes_of(const at::Tensor& t);
}  // namespace detail

}  // namespace whittle::kernels
