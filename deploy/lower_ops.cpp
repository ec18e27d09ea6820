// deploy's lowerings (deploy_lowerings()): the ops that have a bitpacked path. Each hook
// checks what its kernel needs (the forms of its inputs, its weight's encoding, its attributes)
// and declines otherwise, leaving the node to the generic ATen step.

#include <ATen/ATen.h>

#include <mutex>

#include "core/error.h"
#include "core/registration.h"
#include "deploy/int8.h"
#include "deploy/lowering.h"
#include "fuse/fold_math.h"
#include "fuse/fuse.h"
#include "graph/op_registry.h"
#include "kernels/bitpack.h"
#include "kernels/isa.h"
#include "quantize/method.h"
#include "quantize/pack.h"
#include "quantize/quantize.h"

namespace whittle::deploy {
namespace {

// The ±1 float weight of a packed 1-bit sign-coded layer (code 1 = +1, code 0 = −1) with its
// quantization; nullopt for any other weight. The float tensor only lives while the kernels'
// words are packed from it.
std::optional<std::pair<at::Tensor, quantize::WeightQuantization>> packed_signs(const Node& n) {
  auto pc = packed_codes(n);
  if (!pc || pc->q.encoding != quantize::Encoding::kSign || pc->q.bits != 1) return std::nullopt;
  return std::make_pair(pc->codes.to(at::kFloat).mul_(2).sub_(1), std::move(pc->q));
}

// The epilogue of a packed layer: scale·step per output channel (the encoding's scale, per tensor
// or per output channel, times an activation step) and the layer's bias.
kernels::BinaryEpilogue scale_and_bias(const Node& n, const at::Tensor& scale, int64_t out_channels, double step = 1.0) {
  kernels::BinaryEpilogue e;
  e.scale = (scale.to(at::kDouble).reshape({-1}).expand({out_channels}) * step).to(at::kFloat).contiguous();
  if (const at::Tensor* b = n.params.find("bias"); b && b->defined()) e.bias = b->detach().to(at::kFloat).contiguous();
  return e;
}

// Bit-plane layers pay one AND-popcount GEMM per pair of weight and activation planes, and a
// word holds 64 channels of one tap however many the layer has: beyond 4 pairs, below 64 input
// channels, or without AVX-512's vpopcntq, oneDNN's float convolution is faster (docs/kernels.md,
// "Measured speed": W2A2 3×3 on 28×28, one thread, AVX-512: 64 channels 1.17×, 128 1.9×, 256
// 1.9× the float speed; ResNet-20's 16 and 32 channels about 0.3× and 0.6×; AVX2 at 256
// channels 0.70×).
constexpr int64_t kMaxPlanePairs = 4;
constexpr int64_t kMinBitplaneChannels = 64;

// The bit-plane form of packed codes (DoReFa k-bit and 1-bit, TWN ternary); the scale s of the
// encoding goes to the epilogue:
//   DoReFa k ≥ 2: s·(2c/(2^k − 1) − 1)  → planes: the k bits of c, c_i = 2^(i+1)/(2^k − 1), w0 = −1
//   sign (1 bit): s·(2c − 1)            → plane c, c_0 = 2, w0 = −1
//   ternary:      s·(c − 1)             → planes [c = 2], [c = 0], coefficients +1, −1
//   uniform (LSQ): s·(c − 2^(k−1))       → planes: the k bits of c, c_i = 2^i, w0 = −2^(k−1)
int64_t weight_planes(const quantize::WeightQuantization& q) {
  return q.encoding == quantize::Encoding::kTernary ? 2 : q.bits;
}
kernels::PackedBitplaneWeight bitplane_weight(const PackedCodes& pc) {
  std::vector<at::Tensor> planes;
  std::vector<double> coefficients;
  double offset = 0;
  if (pc.q.encoding == quantize::Encoding::kTernary) {
    planes = {pc.codes.eq(2).to(at::kFloat), pc.codes.eq(0).to(at::kFloat)};
    coefficients = {1.0, -1.0};
  } else if (pc.q.encoding == quantize::Encoding::kUniform) {  // s·(c − 2^(k−1))
    for (int64_t i = 0; i < pc.q.bits; ++i) {
      planes.push_back(pc.codes.bitwise_right_shift(i).bitwise_and(1).to(at::kFloat));
      coefficients.push_back(static_cast<double>(int64_t{1} << i));
    }
    offset = -static_cast<double>(int64_t{1} << (pc.q.bits - 1));
  } else {  // kSign (bits 1) and kDoReFa share s·(2c/(2^k − 1) − 1)
    const double levels = static_cast<double>((int64_t{1} << pc.q.bits) - 1);
    for (int64_t i = 0; i < pc.q.bits; ++i) {
      planes.push_back(pc.codes.bitwise_right_shift(i).bitwise_and(1).to(at::kFloat));
      coefficients.push_back(static_cast<double>(int64_t{2} << i) / levels);
    }
    offset = -1.0;
  }
  return kernels::pack_bitplane_weight(planes, coefficients, offset);
}

// A bit-plane convolution reading DoReFa activation codes (`in`), where it beats the float one
// (the limits above); the cheap checks run before any plane is packed.
bool add_bitplane_conv(const Node& n, Lowering& l, const Form& in, const kernels::BinaryConv2dOptions& options) {
  if (kernels::active_isa() != kernels::Isa::kAvx512) return false;
  const auto pc = packed_codes(n);
  if (!pc || weight_planes(pc->q) * in.code_bits > kMaxPlanePairs || pc->codes.size(1) < kMinBitplaneChannels)
    return false;
  BinaryLayer b;
  b.kind = BinaryLayer::Kind::kBitplaneConv;
  b.options = options;
  b.activation_bits = in.code_bits;
  b.activation_clip = in.code_clip;
  // y = s_w·(clip/(2^p − 1))·Σ a·w + bias: the activation step joins the weight scale.
  const double step = in.code_clip / static_cast<double>((int64_t{1} << in.code_bits) - 1);
  b.epilogue = scale_and_bias(n, pc->q.scale, pc->codes.size(0), step);
  b.bitplane = std::make_shared<kernels::PackedBitplaneWeight>(bitplane_weight(*pc));
  l.add_binary_step(n, std::move(b));
  return true;
}

bool lower_conv2d(const Node& n, Lowering& l) {
  if (!l.use_kernels() || n.inputs.size() != 1) return false;
  if (lower_int8_layer(n, l)) return true;
  const Form in = l.form(n.inputs[0]);
  if (in.packed_map || l.graph().value(n.inputs[0]).shape.size() != 4) return false;
  if (n.attr_int("groups") != 1 || n.attr_pair("dilation") != std::vector<int64_t>{1, 1}) return false;
  const auto stride = n.attr_pair("stride"), padding = n.attr_pair("padding");
  const kernels::BinaryConv2dOptions options{stride[0], stride[1], padding[0], padding[1]};
  if (in.code_bits > 0) return add_bitplane_conv(n, l, in, options);
  if (!in.signs) return false;
  const auto w = packed_signs(n);
  if (!w) return false;
  BinaryLayer b;
  b.kind = BinaryLayer::Kind::kConv;
  b.weight = kernels::pack_binary_weight(w->first);
  b.options = options;
  b.epilogue = scale_and_bias(n, w->second.scale, w->first.size(0));
  l.add_binary_step(n, std::move(b));
  return true;
}

bool lower_linear(const Node& n, Lowering& l) {
  if (!l.use_kernels() || n.inputs.size() != 1) return false;
  if (lower_int8_layer(n, l)) return true;
  const Form in = l.form(n.inputs[0]);
  // DoReFa codes into a linear layer: float. bitplane_linear is slower than ATen's GEMM at the
  // sizes measured (LeNet-5's fc1 400 → 120 and fc2 120 → 84, batch 1 and 16: 0.6–0.85×), its
  // fixed costs (packing the planes, the epilogue) outweighing its popcounts.
  if (!in.signs) return false;
  const auto w = packed_signs(n);
  if (!w || w->first.dim() != 2) return false;
  const at::Tensor& signs = w->first;
  BinaryLayer b;
  if (in.packed_map) {
    // The input is the flatten of a packed [C, H, W] map: feature c·H·W + h·W + w is the weight's
    // column of the same index, so the weight viewed as [O, C, H, W] is a convolution covering the map.
    const Shape& m = in.map;
    if (m.size() != 3 || m[0] * m[1] * m[2] != signs.size(1)) return false;
    b.kind = BinaryLayer::Kind::kLinearOnMap;
    b.map = m;
    b.weight = kernels::pack_binary_weight(signs.reshape({signs.size(0), m[0], m[1], m[2]}));
  } else {
    if (l.graph().value(n.inputs[0]).shape.size() != 2) return false;
    b.kind = BinaryLayer::Kind::kLinear;
    b.weight = kernels::pack_binary_weight(signs);
  }
  b.epilogue = scale_and_bias(n, w->second.scale, signs.size(0));
  l.add_binary_step(n, std::move(b));
  return true;
}

// An activation quantizer, by the grid its outputs lie on (quantize/method.h): a sign binarizer
// packs its input (sign(0) = +1, as quantize::bnn_sign); a uniform grid on [0, c] of 1..8 bits runs
// through ATen and marks its output as codes for the bit-plane layers.
bool lower_act_quant(const Node& n, Lowering& l) {
  if (!l.use_kernels()) return false;
  if (lower_int8_quantize(n, l)) return true;
  const quantize::ActivationGrid g = quantize::activation_quantizer_of(n).grid(n);
  if (!g.sign) {
    // Grid activations run through ATen; their output holds codes the bit-plane layers read.
    // A shifted grid (LSQ+) or an affine one (int8) stays float.
    if (g.bits < 1 || g.bits > 8 || g.offset != 0.0 || g.affine) return false;
    l.add_generic_step(n);
    Form f;
    f.code_bits = g.bits;
    f.code_clip = g.max;
    l.set_form(n.outputs[0], f);
    return true;
  }
  // A learned threshold (RSign) is packed by its threshold_sign form (fuse::fold_bn_into_threshold);
  // left as an act_quant it runs as its forward.
  if (const OpTraits& t = op_traits(n.op); t.sign_shift && t.sign_shift(n).defined()) return false;
  const Shape& shape = l.graph().value(n.inputs[0]).shape;
  const Form in = l.form(n.inputs[0]);
  if (!in.packed_map && shape.size() != 2 && shape.size() != 4) return false;
  const int64_t channels = in.packed_map ? in.map[0] : shape[1];
  l.add_step(n, "pack_signs", [channels, flattened = in.packed_map](std::vector<Value>& frame, const Step& s) {
    Value& x = frame[s.inputs[0]];
    // Channels are only known to the word downstream: check them here, where the floats are.
    if (!x.has_words() && x.tensor().dim() >= 2 && x.tensor().size(1) != channels)
      throw Error("expected " + std::to_string(channels) + " channels, got " + std::to_string(x.tensor().size(1)));
    frame[s.outputs[0]] = Value::of_words(x.words(), channels, flattened);
  });
  l.set_form(n.outputs[0], Form{true, in.packed_map, in.map});
  return true;
}

// BN → sign as a threshold: folded into the binary layer before it when it is that layer's only
// user (the layer then writes packed signs), else the op's forward, whose output is ±1.
bool lower_threshold_sign(const Node& n, Lowering& l) {
  if (!l.use_kernels()) return false;
  if (Step* producer = l.fusable_binary_producer(n.inputs[0], n);
      producer && !producer->binary->bitplane && !producer->binary->epilogue.threshold.defined()) {
    producer->binary->epilogue.threshold = n.buffers.at("threshold").to(at::kFloat).contiguous();
    producer->binary->epilogue.direction = n.buffers.at("direction").to(at::kFloat).contiguous();
    producer->kernel += " + threshold";
    l.absorb(*producer, n);
  } else {
    l.add_generic_step(n);
  }
  l.set_form(n.outputs[0], Form{true, false, {}});
  return true;
}

// Inference batch norm after a binary layer with float output: y·s + (β − μ·s) per channel with
// s = γ/√(σ² + ε) is affine like the epilogue, so it folds into the epilogue's scale and bias
// (fuse::fold_batchnorm cannot fold it into the weight: the weight is packed signs).
bool lower_batch_norm(const Node& n, Lowering& l) {
  if (!l.use_kernels()) return false;
  Step* producer = l.fusable_binary_producer(n.inputs[0], n);
  if (!producer || producer->binary->epilogue.threshold.defined()) return false;
  fuse::BatchNormParams bn;
  bn.running_mean = n.buffers.at("running_mean");
  bn.running_var = n.buffers.at("running_var");
  if (const at::Tensor* w = n.params.find("weight")) bn.weight = *w;
  if (const at::Tensor* b = n.params.find("bias")) bn.bias = *b;
  bn.eps = n.attr_float("eps");
  const at::Tensor s = fuse::bn_scale(bn, /*high_precision=*/true).detach();
  kernels::BinaryEpilogue& e = producer->binary->epilogue;
  const int64_t O = producer->binary->out_channels();
  if (s.numel() != O) return false;
  const at::Tensor scale = e.scale.defined() ? e.scale.to(at::kDouble) : at::ones({O}, at::kDouble);
  const at::Tensor bias = e.bias.defined() ? e.bias.to(at::kDouble) : at::zeros({O}, at::kDouble);
  at::Tensor shift = (bias - bn.running_mean.detach().to(at::kDouble)) * s;
  if (bn.bias.defined()) shift = shift + bn.bias.detach().to(at::kDouble);
  e.scale = (scale * s).to(at::kFloat).contiguous();
  e.bias = shift.to(at::kFloat).contiguous();
  producer->kernel += " + batch_norm";
  l.absorb(*producer, n);
  return true;
}

// Max pooling of ±1 maps on packed words (an AND over each window).
bool lower_max_pool2d(const Node& n, Lowering& l) {
  if (!l.use_kernels()) return false;
  if (lower_int8_move(n, l)) return true;
  const Form& in = l.form(n.inputs[0]);
  if (!in.signs || in.packed_map || l.graph().value(n.inputs[0]).shape.size() != 4) return false;
  if (n.attr_pair("dilation") != std::vector<int64_t>{1, 1}) return false;
  const auto k = n.attr_pair("kernel_size");
  const auto s = n.has_attr("stride") ? n.attr_pair("stride") : k;
  const auto p = n.attr_pair("padding");
  kernels::SignPool2dOptions o{k[0], k[1], s[0], s[1], p[0], p[1], n.attr_bool("ceil_mode")};
  const int64_t channels = l.graph().value(n.inputs[0]).shape[1];
  l.add_step(n, "max_pool2d_signs", [o, channels](std::vector<Value>& frame, const Step& st) {
    frame[st.outputs[0]] = Value::of_words(kernels::max_pool2d_signs(frame[st.inputs[0]].words(), o), channels);
  });
  l.set_form(n.outputs[0], Form{true, false, {}});
  return true;
}

// Flatten [N, C, H, W] → [N, C·H·W] of packed signs: the words stay as they are.
bool lower_flatten(const Node& n, Lowering& l) {
  if (!l.use_kernels()) return false;
  if (lower_int8_move(n, l)) return true;
  const Form& in = l.form(n.inputs[0]);
  const Shape& shape = l.graph().value(n.inputs[0]).shape;
  if (!in.signs || in.packed_map || shape.size() != 4) return false;
  if (n.attr_int("start_dim") != 1 || (n.attr_int("end_dim") != -1 && n.attr_int("end_dim") != 3)) return false;
  const int64_t channels = shape[1];
  l.add_step(n, "flatten (packed, no copy)", [channels](std::vector<Value>& frame, const Step& s) {
    frame[s.outputs[0]] = Value::of_words(frame[s.inputs[0]].words(), channels, true);
  });
  l.set_form(n.outputs[0], Form{true, true, {shape[1], shape[2], shape[3]}});
  return true;
}

void attach_hooks() {
  ensure_registered();
  static std::once_flag once;
  std::call_once(once, [] {
    quantize::register_all();
    fuse::register_all();
    deploy_lowerings().add("conv2d", lower_conv2d);
    deploy_lowerings().add("linear", lower_linear);
    deploy_lowerings().add("act_quant", lower_act_quant);
    deploy_lowerings().add("threshold_sign", lower_threshold_sign);
    deploy_lowerings().add("batch_norm", lower_batch_norm);
    deploy_lowerings().add("max_pool2d", lower_max_pool2d);
    deploy_lowerings().add("flatten", lower_flatten);
    deploy_lowerings().add("add", [](const Node& n, Lowering& l) { return l.use_kernels() && lower_int8_add(n, l); });
  });
}

}  // namespace

Registry<DeployLowerFn>& deploy_lowerings() {
  static Registry<DeployLowerFn> r("deploy lowering", "lowerings", [](const DeployLowerFn&) { return std::string("bitpacked path"); });
  return r;
}

void register_all() { attach_hooks(); }

WHITTLE_REGISTER_MODULE("deploy", &register_all)

}  // namespace whittle::deploy
