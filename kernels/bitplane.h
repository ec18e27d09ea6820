#pragma once
// Bit-plane kernels: layers whose weights and activations are small unsigned integer codes
// (DoReFa k-bit weights and activations, TWN ternary weights), computed with AND + popcount over
// one bit-plane of each at a time.
//
// Math: an activation code a ∈ [0, 2^p) is Σ_j 2^j·a_j over its bit-planes a_j ∈ {0, 1}; a weight
// value is w = Σ_i c_i·w_i + w0 over 0/1 weight planes w_i with coefficients c_i and an offset
// w0. Over the K positions of a dot,
//   Σ a·w = Σ_i c_i Σ_j 2^j·popcount(a_j ∧ w_i) + w0·Σ_j 2^j·popcount(a_j).
// TWN's ternary codes give two planes w⁺ = [w = +α], w⁻ = [w = −α] with c = +1, −1, w0 = 0
// (dot = popcount(a ∧ w⁺) − popcount(a ∧ w⁻) per activation plane); DoReFa k-bit weights
// s·(2c/(2^k − 1) − 1) give the k bits of c with c_i = 2^(i+1)/(2^k − 1), w0 = −1 (times s in
// the epilogue). Zero padding is exact without correction: a padded position has code 0, so it
// sets no bit of any plane (DoReFa activations: code 0 is the value 0).
// Zhou et al. 2016 (DoReFa-Net, sec. 2.1: bit convolution kernels); Li & Liu 2016 (TWN).
//
// Devices as binary_conv.h: each kernel runs on its input's device, the CPU or a CUDA GPU (in a
// build with WHITTLE_CUDA; the same integer sums and the same epilogue, in the same order).

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "kernels/binary_conv.h"

namespace whittle::kernels {

/// Weights as bit-planes for the kernels: value = Σ_i coefficients[i]·plane_i + offset.
struct PackedBitplaneWeight {
  /// Each plane's bits in pack_binary_weight's layout (words int64 [kh·kw·⌈C/64⌉, O], K-major;
  /// bit 1 where the plane is 1).
  std::vector<PackedBinaryWeight> planes;
  std::vector<double> coefficients;  ///< c_i, one per plane
  double offset = 0.0;               ///< w0
  int64_t out_channels = 0, in_channels = 0, kernel_h = 1, kernel_w = 1;

  /// The same weight with its planes on `device`.
  PackedBitplaneWeight to(const at::Device& device) const;
};

/// Packs 0/1 weight planes (float tensors of one shape: [O, C, kh, kw] or [O, C]; nonzero = 1)
/// with their coefficients and offset. Throws whittle::Error when there are no planes or more than
/// 8 (DoReFa 8-bit weights), the shapes differ, or the counts of planes and coefficients differ
/// (and as pack_binary_weight).
PackedBitplaneWeight pack_bitplane_weight(const std::vector<at::Tensor>& planes, const std::vector<double>& coefficients,
                                          double offset);

/// The bit-planes of unsigned integer codes `codes` (any integer or integral float dtype, values
/// in [0, 2^bits); [N, C, H, W] or [N, C]): int64 [bits, N, H, W, ⌈C/64⌉] or [bits, N, ⌈C/64⌉],
/// plane j holding bit j of every code in pack_signs's word layout (bit 1 where set), on the
/// codes' device. Throws whittle::Error for bits outside 1..8, another rank, a device the kernels
/// do not run on, or a code out of range.
at::Tensor pack_bitplanes(const at::Tensor& codes, int64_t bits);

/// A bit-plane convolution: activation planes [P, N, H, W, ⌈C/64⌉] (pack_bitplanes) and a
/// bit-plane weight give float [N, O, Ho, Wo] = scale[o]·(Σ a·w) + bias[o] (the epilogue's scale
/// and bias; threshold unsupported). The popcounts are summed exactly in int32 per weight plane
/// and combined with the coefficients in double. Multi-threaded over (n, output row); the active
/// instruction set. Throws whittle::Error when the planes or shapes do not fit, or the epilogue
/// holds a threshold.
at::Tensor bitplane_conv2d(const at::Tensor& activation_planes, const PackedBitplaneWeight& weight,
                           const BinaryConv2dOptions& options, const BinaryEpilogue& epilogue);

/// A bit-plane linear layer: planes [P, N, ⌈C/64⌉], weight of [O, C] planes; float [N, O]. Same
/// rules and errors as bitplane_conv2d.
at::Tensor bitplane_linear(const at::Tensor& activation_planes, const PackedBitplaneWeight& weight,
                           const BinaryEpilogue& epilogue);

}  // namespace whittle::kernels
