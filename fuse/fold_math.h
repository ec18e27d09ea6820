#pragma once
// The arithmetic of the fusion passes, as pure functions over tensors (no graph): batch-norm
// folding into a preceding conv / transposed conv / linear layer, RepVGG branch merging, and the
// per-channel threshold that replaces BN followed by the sign binarizer. The passes in this
// folder only match patterns and call these; each is unit-tested on its own (tests/fuse_test.cpp).
//
// Notation: a BN layer in inference form computes y = γ·(x − μ)/√(σ² + ε) + β per channel, with
// μ = running_mean, σ² = running_var (never batch statistics), γ = weight (1 when affine=False),
// β = bias (0 when affine=False).

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace whittle::fuse {

/// The tensors of one BN layer. `weight` / `bias` may be undefined (affine=False: γ = 1, β = 0).
/// All defined tensors are [C] and floating point.
struct BatchNormParams {
  at::Tensor running_mean;  ///< μ [C]
  at::Tensor running_var;   ///< σ² [C]
  at::Tensor weight;        ///< γ [C] or undefined
  at::Tensor bias;          ///< β [C] or undefined
  double eps = 1e-5;        ///< ε, added to σ² inside the square root
};

/// Where a layer's output channels lie in its weight.
enum class WeightLayout {
  kOutputFirst,  ///< conv2d [Cout, Cin/g, kh, kw] and linear [out, in]: output channel = axis 0
  kTransposed,   ///< conv_transpose2d [Cin, Cout/g, kh, kw]: output channel g·(Cout/g) + j is column j
                 ///< (axis 1) of the rows of group g
};

/// A layer followed by a BN layer, the input of fold_conv_bn_params.
struct ConvBnParams {
  at::Tensor weight;  ///< the layer's weight (layout below), floating point
  at::Tensor bias;    ///< the layer's bias [Cout], or undefined (no bias: b = 0)
  BatchNormParams bn;
  WeightLayout layout = WeightLayout::kOutputFirst;
  int64_t groups = 1;  ///< groups of a transposed convolution (ignored for kOutputFirst)
};

/// A folded layer: weight in the layer's own layout and a bias [Cout] (always defined).
struct FoldedParams {
  at::Tensor weight;
  at::Tensor bias;
};

/// The per-channel BN scale s = γ/√(σ² + ε) [C], computed in the dtype of running_var (float64 if
/// `high_precision`). Differentiable in γ. A channel with σ² = 0 stays finite when ε > 0 (s = γ/√ε).
/// Example: γ = 1, σ² = 1e−4, ε = 1e−3 gives 1/√(1.1e−3) = 30.151.
at::Tensor bn_scale(const BatchNormParams& bn, bool high_precision = false);

/// Multiplies the weight's output channels by `scale` [Cout] (broadcast along axis 0 for
/// kOutputFirst; along axis 1 within each of the `groups` row blocks for kTransposed).
/// Differentiable; returns a tensor of the weight's dtype. Throws whittle::Error when the sizes
/// do not fit (scale not [Cout], groups not dividing the rows).
at::Tensor scale_output_channels(const at::Tensor& weight, const at::Tensor& scale, WeightLayout layout,
                                 int64_t groups = 1);

/// Folds a BN layer into the layer before it (Jacob et al. 2018, sec. 3.2; DESIGN.md):
///   W' = W·s per output channel,  b' = β + (b − μ)·s,  s = γ/√(σ² + ε).
/// The arithmetic runs in float64 and the result is cast back to the weight's dtype, on its device,
/// without autograd history. Example: a 1×1 conv with weight 2, bias 1, BN γ = 3, β = 0.5, μ = 4,
/// σ² = 0.25, ε = 0 gives weight 12 and bias −17.5 (x = 1 maps to −5.5 either way).
/// Throws whittle::Error when the BN tensors are not [Cout] or the weight is not floating point.
FoldedParams fold_conv_bn_params(const ConvBnParams& params);

/// The same arithmetic in the weight's own dtype and differentiable in W, γ, β (used by
/// BN folding during quantization-aware training, where the folded weight is recomputed on every
/// forward pass). finalize and the running-statistics forward of the QAT op both call it, so they
/// agree bitwise.
FoldedParams fold_conv_bn_params_differentiable(const ConvBnParams& params);

/// Zero-pads a conv kernel [Cout, Cin/g, kh, kw] symmetrically to [Cout, Cin/g, KH, KW] (RepVGG:
/// a 1×1 kernel becomes a 3×3 kernel with the weight at the centre). Throws whittle::Error unless
/// KH − kh and KW − kw are even and non-negative.
at::Tensor pad_kernel(const at::Tensor& kernel, int64_t kh, int64_t kw);

/// The kernel of the identity map as a grouped conv: [C, C/groups, kh, kw] of zeros with 1 at
/// [i, i mod (C/groups), kh/2, kw/2] (Ding et al. 2021, sec. 3.4). kh and kw must be odd.
/// Throws whittle::Error when groups does not divide C or a kernel size is even.
at::Tensor identity_kernel(int64_t channels, int64_t groups, int64_t kh, int64_t kw, const at::TensorOptions& options);

/// Sums branches that read the same input with the same stride and groups into one conv
/// (RepVGG re-parameterization, Ding et al. 2021): every kernel is padded to [.., kh, kw] with
/// pad_kernel, then weights and biases are added. Each branch is already folded (weight, bias).
/// Throws whittle::Error for an empty list or branches whose output channels differ.
FoldedParams merge_branches(const std::vector<FoldedParams>& branches, int64_t kh, int64_t kw);

/// BN followed by the sign binarizer (sign(0) = +1) as a per-channel threshold on the BN input y:
///   sign(γ(y − μ)/σ + β) = +1  ⇔  y ≥ τ (γ > 0)  or  y ≤ τ (γ < 0),   τ = μ − β·σ/γ,  σ = √(σ² + ε).
/// γ = 0 gives the constant sign(β) (+1 when β = 0), written as τ = −∞ (always +1) or +∞ (always −1)
/// with direction +1. Computed in float64, returned in the dtype of running_mean.
struct SignThreshold {
  at::Tensor threshold;  ///< τ [C]
  at::Tensor direction;  ///< +1 (compare y ≥ τ) or −1 (compare y ≤ τ) [C], same dtype as threshold
};
SignThreshold bn_sign_threshold(const BatchNormParams& bn);

/// Applies a threshold: +1 where direction·(y − τ) ≥ 0, else −1, with τ and direction broadcast
/// along dim 1 of y [N, C, ...]. Output has y's dtype; no gradient.
at::Tensor apply_sign_threshold(const at::Tensor& y, const at::Tensor& threshold, const at::Tensor& direction);

}  // namespace whittle::fuse
