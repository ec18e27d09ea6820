#pragma once
// Quantizers of quantization-aware training, as differentiable functions with straight-through
// estimators (STE): the forward pass rounds, the backward pass uses the hand-written surrogate
// gradient of each method. They work on CPU and CUDA tensors of any floating dtype and are pure:
// no graph, no state.
//
// Every weight quantizer is written as decode(encode(w)): `encode` gives integer codes and scales
// (what a packed checkpoint stores) and `decode` turns them back into values. The forward pass of
// the quantizer and the decoding of a packed checkpoint share decode_weight(), so a reloaded
// model runs with bitwise the weights it was trained with.
//
// Rounding is half-to-even everywhere (at::round, as torch.round and ONNX QuantizeLinear).
//
// Methods (DESIGN.md, "Compression semantics"):
//   DoReFa (Zhou et al., 2016, arXiv:1606.06160)
//     weights, k = 2..8: w' = tanh(w) / (2·max|tanh(w)|) + 1/2, w_q = 2·quantize_k(w') − 1;
//                        gradient (1 − tanh²(w)) / max|tanh(w)| (the max treated as a constant)
//     weights, k = 1:    sign(w)·mean|w| (sign(0) = +1); gradient passed straight through
//     weights, k = 32:   identity
//     activations:       quantize_k(clip(a, 0, 1)); gradient 1 on [0, 1], 0 outside; k = 32 identity.
//                        With a clip level c ≠ 1 (activation_clip): c·quantize_k(clip(a, 0, c) / c),
//                        gradient 1 on [0, c] (the fixed clipping level of PACT, Choi et al. 2018,
//                        arXiv:1805.06085: a wider range for the unbounded output of BN + ReLU)
//   TWN (Li & Liu, 2016, arXiv:1605.04711): Δ = 0.7·mean|W|, α = mean of |W| over |W| > Δ (0 when
//     none), w_q = α·sign(W)·[|W| > Δ]; gradient passed straight through
//   BNN (Hubara et al., 2016, arXiv:1602.02830): sign(x) with sign(0) = +1; gradient 1 where
//     |x| ≤ 1, else 0 (weights and activations)
//   XNOR-Net (Rastegari et al., 2016, arXiv:1603.05279): α_c·sign(W_c), α_c = mean|W_c| per
//     output channel; the sign has the BNN gradient; α differentiable unless detached. Binary
//     activations sign(x), optionally scaled by K (xnor_activation_scale).

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace whittle::quantize {

/// Whether the quantizers below run the fused kernels of quantize/fused_quantizers.h (one pass
/// forward keeping a bit mask for the gradient, one pass backward) on contiguous float32 tensors,
/// the ATen-op forms on everything else. Default on; the environment variable
/// WHITTLE_FUSED_QUANTIZERS=0 (read once) or set_fused_quantizers(false) turns it off, which runs
/// the ATen-op forms everywhere (the reference the fused kernels are tested against; the values
/// are the same either way).
bool fused_quantizers_enabled();
/// Turns the fused kernels on or off for every thread from now on.
void set_fused_quantizers(bool on);
/// Whether the fused kernels also take CUDA tensors (in a build with WHITTLE_CUDA). Default off
/// until their tests (tests/fused_quantizers_test.cpp, FusedQuantizersCuda) have passed on a GPU:
/// WHITTLE_FUSED_QUANTIZERS_CUDA=1 (read once) or set_fused_quantizers_cuda(true) turns it on.
/// Without it CUDA tensors take the ATen-op forms.
bool fused_quantizers_cuda_enabled();
/// Turns the CUDA fused kernels on or off for every thread from now on.
void set_fused_quantizers_cuda(bool on);
/// Whether the fused kernels take `t` under the two switches above: a tensor fused::fused_supported
/// takes (contiguous float32, CPU or, in a CUDA build, CUDA), with the fused kernels on and, for a
/// CUDA tensor, the CUDA ones too.
bool fused_quantizers_take(const at::Tensor& t);

/// Where a scale (or DoReFa's max) is computed: over the whole tensor, or per output channel.
enum class Granularity { kPerTensor, kPerChannel };

/// "per_tensor" | "per_channel".
const char* granularity_name(Granularity g);
/// Inverse of granularity_name; throws whittle::Error naming `text` when unknown.
Granularity granularity_from_name(const std::string& text);

/// How integer codes map to values (the `encoding` of a packed weight; docs/checkpoint-format.md).
enum class Encoding {
  kDoReFa,      ///< value = scale·(2·c/(2^k − 1) − 1), c ∈ [0, 2^k − 1] (k = 2..8; scale 1)
  kSign,        ///< value = scale·(2·c − 1), c ∈ {0, 1} (BNN: scale 1; XNOR and DoReFa 1-bit: mean|W|)
  kTernary,     ///< value = scale·(c − 1), c ∈ {0, 1, 2} (TWN)
  kUniform,     ///< value = scale·(c − 2^(k−1)), c ∈ [0, 2^k − 1]: the signed grid [−2^(k−1), 2^(k−1) − 1] of LSQ (k = 2..8)
};

/// "dorefa" | "sign" | "ternary" | "uniform".
const char* encoding_name(Encoding e);
/// Inverse of encoding_name; throws whittle::Error naming `text` when unknown.
Encoding encoding_from_name(const std::string& text);
/// Every encoding's name, in declaration order.
std::vector<std::string> encoding_names();

/// Integer codes and scales of a quantized weight.
struct EncodedWeight {
  at::Tensor codes;  ///< same shape as the weight, float dtype holding integral values 0..2^bits−1
  at::Tensor scale;  ///< float, [1] per tensor or [C] per output channel (C = weight.size(axis))
  Encoding encoding = Encoding::kDoReFa;
  int64_t bits = 8;  ///< bits per code when packed (ternary: 2)
  int64_t axis = 0;  ///< output-channel axis of the weight (0 for conv2d/linear, 1 for conv_transpose2d)
};

/// The values of `codes` (any integer or float dtype, shape of the weight) under `encoding`:
/// `scale` is [1] or [codes.size(axis)] and broadcasts along `axis`. Returns a tensor of `dtype`.
/// This is the one function both the quantizers' forward pass and packed checkpoints use.
/// Throws whittle::Error for a scale whose size fits neither granularity.
at::Tensor decode_weight(const at::Tensor& codes, const at::Tensor& scale, Encoding encoding, int64_t bits, int64_t axis,
                         at::ScalarType dtype);

/// quantize_k(r) = round(r·(2^k − 1)) / (2^k − 1) for r in [0, 1] (half-to-even), no gradient
/// handling (the pure rounding grid). Throws whittle::Error unless 1 ≤ k ≤ 16.
at::Tensor quantize_k(const at::Tensor& r, int64_t bits);

/// DoReFa weight codes: k = 2..8 codes round(w'·(2^k − 1)) with scale 1 (max|tanh| per tensor or
/// per output channel); k = 1 sign codes with scale mean|w|. Throws whittle::Error for other k.
EncodedWeight dorefa_encode(const at::Tensor& w, int64_t bits, Granularity granularity = Granularity::kPerTensor,
                            int64_t axis = 0);
/// DoReFa-quantized weight with its STE gradient (see the header comment); `bits` in 1..8 or 32.
/// Throws whittle::Error for other widths.
at::Tensor dorefa_weight(const at::Tensor& w, int64_t bits, Granularity granularity = Granularity::kPerTensor,
                         int64_t axis = 0);
/// DoReFa activation `clip`·quantize_k(clip(x, 0, `clip`) / `clip`): 2^bits levels evenly spaced on
/// [0, clip], gradient 1 on [0, clip] and 0 outside; `clip` = 1 is the paper's quantize_k(clip(x, 0,
/// 1)). `bits` in 1..8 or 32 (identity). Example: bits 2, clip 2: levels 0, 2/3, 4/3, 2; x = 0.5 →
/// 2/3, x = 3 → 2 (gradient 0). Throws whittle::Error for other widths or a clip that is not a
/// finite value > 0. With `after_relu` it is the quantizer of relu(x), the ReLU folded in (the
/// quantize pass's act_quant with relu = 1): the same values (clip(relu(x), 0, c) = clip(x, 0, c)),
/// gradient 1 on (0, clip] (ReLU's gradient is 0 at x = 0); bits 32 is then relu(x).
at::Tensor dorefa_activation(const at::Tensor& x, int64_t bits, double clip = 1.0, bool after_relu = false);

/// TWN threshold and scale of `w`: Δ = 0.7·mean|W| and α = mean |W| over |W| > Δ (0 when no
/// element exceeds Δ), each [1] per tensor or [C] per output channel along `axis`.
struct TwnThreshold {
  at::Tensor delta;
  at::Tensor alpha;
};
TwnThreshold twn_threshold(const at::Tensor& w, Granularity granularity = Granularity::kPerChannel, int64_t axis = 0);
/// TWN codes (0: −α, 1: 0, 2: +α) and α.
EncodedWeight twn_encode(const at::Tensor& w, Granularity granularity = Granularity::kPerChannel, int64_t axis = 0);
/// TWN ternary weight with a straight-through gradient. An all-zero W gives zeros (α = 0) and a
/// finite gradient.
at::Tensor twn_weight(const at::Tensor& w, Granularity granularity = Granularity::kPerChannel, int64_t axis = 0);

/// BNN sign codes (1 for x ≥ 0, including −0.0; 0 for x < 0) with scale 1.
EncodedWeight bnn_encode(const at::Tensor& w, int64_t axis = 0);
/// BNN sign(x) ∈ {−1, +1} (never 0) with gradient 1 where |x| ≤ 1 and 0 elsewhere. For weights
/// and activations alike.
at::Tensor bnn_sign(const at::Tensor& x);

/// XNOR-Net weight codes (sign) and α = mean|W| per output channel (or per tensor).
EncodedWeight xnor_encode(const at::Tensor& w, Granularity granularity = Granularity::kPerChannel, int64_t axis = 0);
/// XNOR-Net weight α·sign(W): the sign has the BNN gradient; α = mean|W| is differentiable
/// (its gradient adds sign(W)·Σ(upstream·sign)/n) unless `detach_alpha`.
at::Tensor xnor_weight(const at::Tensor& w, bool detach_alpha = false, Granularity granularity = Granularity::kPerChannel,
                       int64_t axis = 0);

/// XNOR-Net's activation scale K for a layer reading `x` [N, C, H, W]: A = mean_c |x| [N, 1, H, W]
/// averaged over each k×k window of the layer (avg_pool2d with its kernel, stride and padding,
/// zeros counted), giving [N, 1, Ho, Wo] that multiplies the layer's output. For a linear layer
/// (`x` [N, F], empty kernel) K = mean_f |x| [N, 1]. Differentiable (plain ATen ops).
at::Tensor xnor_activation_scale(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                                 at::IntArrayRef padding);

}  // namespace whittle::quantize
