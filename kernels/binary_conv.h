#pragma once
// Binary convolution and binary linear layers on packed signs (XNOR-popcount), with the
// per-channel scale, bias and BN→threshold epilogues fused.
//
// Math: for a ±1 input x and ±1 weights w over K positions, Σ x·w = K − 2·popcount(x ⊕ w), with
// both packed by pack_signs's rule (bit 1 = −1, sign(0) = +1). Zero padding is exact: a padded
// input position contributes 0, as in the float convolution of the binarized tensors. The kernel
// leaves padded taps out of K and out of the popcount (a tap outside the input reads zero words,
// and the popcount of the weight words of that tap, kept per tap, is subtracted).
// Rastegari et al. 2016 (XNOR-Net), Hubara et al. 2016 (BNN); FINN's threshold epilogue
// (Umuroglu et al. 2017).
//
// Devices: every kernel runs on the device of its packed input, the CPU or, in a build with
// WHITTLE_CUDA, a CUDA GPU (kernels/kernels_cuda.cu: one thread per output, the same integer dots
// and the same float epilogue, operation for operation); the weight must be on that device too
// (PackedBinaryWeight::to). A tensor on another device is a whittle::Error.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace whittle::kernels {

/// Binary weights packed for the kernels.
struct PackedBinaryWeight {
  /// int64 [kernel_h·kernel_w·⌈C/64⌉, O] (K-major, the microkernels' layout): row k holds word k
  /// of every output channel's packed weight, whose words are its taps in (kh, kw) order, each
  /// tap's C channels in ⌈C/64⌉ words (pack_signs's bit rule).
  at::Tensor words;
  /// int32 [kernel_h·kernel_w, O]: popcount of each tap's words per output channel (the padding
  /// correction).
  at::Tensor tap_popcount;
  int64_t out_channels = 0;  ///< O
  int64_t in_channels = 0;   ///< C
  int64_t kernel_h = 1, kernel_w = 1;

  /// The same weight with its tensors on `device` (a copy of the words; the shape fields kept).
  PackedBinaryWeight to(const at::Device& device) const;
};

/// Packs the signs of float weights [O, C, kh, kw] (a convolution's) or [O, C] (a linear
/// layer's, kernel 1×1), on the weight's device (packed on the CPU and copied there). Throws
/// whittle::Error for another rank, a non-floating tensor, a device the kernels do not run on,
/// or C·kh·kw outside 1 … 2^30 − 1 (the int32 dots).
PackedBinaryWeight pack_binary_weight(const at::Tensor& weight);

/// Stride and zero padding of a binary convolution (dilation 1, groups 1).
struct BinaryConv2dOptions {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
};

/// What the kernel writes per output (n, o, position), from the exact integer dot d:
///   y = d·scale[o] + bias[o]  (scale, bias: float [O]; undefined scale = 1, bias = 0);
///   with threshold and direction (float [O]) defined, the output is instead the packed sign of
///   threshold_sign(y) (fuse/bn_threshold.h: +1 where (y − threshold[o])·direction[o] ≥ 0, so a
///   NaN y gives −1, as fuse::apply_sign_threshold), in pack_signs's layout, ready for the next
///   binary layer.
struct BinaryEpilogue {
  at::Tensor scale, bias;
  at::Tensor threshold, direction;
};

/// Output size of a convolution along one axis: (in + 2·pad − kernel) / stride + 1. Throws
/// whittle::Error for stride < 1, pad < 0, kernel < 1, or an input smaller than the kernel.
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad);

/// The integer dots of a binary convolution: input packed int64 [N, H, W, ⌈C/64⌉] (pack_signs),
/// output int32 [N, O, Ho, Wo] on the input's device. On the CPU multi-threaded over (n, output
/// row) with ATen's thread pool, using the active instruction set (kernels/isa.h). Throws
/// whittle::Error when the input's words or shape do not fit the weight or the options, the weight
/// is not pack_binary_weight's form, or the two are on different devices.
/// The input's channel count is known only to the word: an input packed from C' ≠ C channels with
/// ⌈C'/64⌉ = ⌈C/64⌉ is not detected (its missing channels read as +1 or are ignored).
at::Tensor binary_conv2d_dot(const at::Tensor& packed_input, const PackedBinaryWeight& weight,
                             const BinaryConv2dOptions& options = {});

/// A binary convolution with the epilogue applied: float [N, O, Ho, Wo], or with a threshold
/// epilogue packed int64 [N, Ho, Wo, ⌈O/64⌉]. Same threading and errors as binary_conv2d_dot,
/// plus epilogue tensors that are not [O] or a threshold without a direction.
at::Tensor binary_conv2d(const at::Tensor& packed_input, const PackedBinaryWeight& weight,
                         const BinaryConv2dOptions& options, const BinaryEpilogue& epilogue);

/// A binary linear layer: input packed int64 [N, ⌈C/64⌉], weight from pack_binary_weight of
/// [O, C]; output int32 dots [N, O]. Multi-threaded over blocks of output channels; the active
/// instruction set. Throws whittle::Error when the input's words do not fit the weight or the
/// weight is a convolution's (kernel other than 1×1); same channel caveat as binary_conv2d_dot.
at::Tensor binary_linear_dot(const at::Tensor& packed_input, const PackedBinaryWeight& weight);

/// binary_linear_dot with the epilogue: float [N, O], or packed int64 [N, ⌈O/64⌉]. Same errors,
/// plus epilogue tensors that are not [O] or a threshold without a direction.
at::Tensor binary_linear(const at::Tensor& packed_input, const PackedBinaryWeight& weight,
                         const BinaryEpilogue& epilogue);

/// Plain-loop reference of binary_conv2d_dot from float tensors: x [N, C, H, W] and w
/// [O, C, kh, kw] are binarized (sign(0) = +1), the padded positions read 0, and the dots are
/// summed one product at a time, on the CPU. int32 [N, O, Ho, Wo] on x's device. Throws
/// whittle::Error for undefined tensors, other ranks, mismatched C, or options conv_output_size
/// refuses.
at::Tensor binary_conv2d_reference(const at::Tensor& x, const at::Tensor& w, const BinaryConv2dOptions& options = {});

}  // namespace whittle::kernels
