// What the binary methods share (binary.h): the sign with its gradient options (STE, ApproxSign,
// EDE), Libra-PB's standardized weights, and RSign, the sign with a learned per-channel threshold.

#include "quantize/binary.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>

#include <cmath>

#include "core/error.h"
#include "graph/op_registry.h"

namespace whittle::quantize {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

// sign(x) ∈ {−1, +1}, sign(0) = +1, in x's dtype.
at::Tensor plus_minus_one(const at::Tensor& x) {
  return at::where(x >= 0, at::ones({}, x.options()), at::full({}, -1.0, x.options()));
}

// sign with ApproxSign's or EDE's gradient (kSte goes through bnn_sign).
struct ShapedSignFn : public torch::autograd::Function<ShapedSignFn> {
  static Variable forward(AutogradContext* ctx, const Variable& x, int64_t kind, double t) {
    ctx->save_for_backward({x});
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["t"] = t;
    return plus_minus_one(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const Variable x = ctx->get_saved_variables()[0];
    const auto kind = static_cast<SignGradient>(ctx->saved_data["kind"].toInt());
    at::Tensor d;
    if (kind == SignGradient::kApproxSign) {
      d = at::clamp_min(2.0 - 2.0 * x.abs(), 0.0);  // d/dx of 2x ± x², 0 outside (−1, 1)
    } else {
      const double t = ctx->saved_data["t"].toDouble();
      const double k = std::max(1.0 / t, 1.0);
      const at::Tensor th = at::tanh(x * t);
      d = (1.0 - th * th) * (k * t);
    }
    return {grad[0] * d, Variable(), Variable()};
  }
};

// [C] viewed along dim 1 of a rank-`rank` tensor.
at::Tensor on_channels(const at::Tensor& v, int64_t rank) {
  std::vector<int64_t> shape(static_cast<size_t>(rank), 1);
  shape[1] = v.numel();
  return v.reshape(shape);
}

const at::Tensor& rsign_shift(const Node& n) {
  const at::Tensor* s = n.params.find("shift");
  if (!s || !s->defined()) node_fail(n, "RSign has no shift parameter (the quantize pass creates it, [C])");
  return *s;
}

void register_rsign() {
  ActivationQuantizer a;
  a.name = "rsign";
  a.description =
      "ReActNet's RSign (Liu et al. 2020): sign(x - shift), shift learned per channel (dim 1), sign(0) = +1";
  a.placement = Placement::kBinarizeReluInput;
  a.params = {"shift"};
  a.attributes = sign_gradient_attributes();
  a.attributes.insert(a.attributes.begin(),
                      AttrSpec::integer("activation_bits", 1, "bits per activation: 1, the sign").range(1, 1));
  a.check = [](const Node&) {};
  a.forward = [](const Node& n, const at::Tensor& x, bool) {
    const at::Tensor& shift = rsign_shift(n);
    if (x.dim() < 2 || x.size(1) != shift.numel())
      node_fail(n, "RSign's shift has " + std::to_string(shift.numel()) + " channels but its input has shape " +
                       shape_str(x.sizes().vec()));
    return node_sign(n, x - on_channels(shift.to(x.scalar_type()), x.dim()));
  };
  a.grid = [](const Node&) {
    ActivationGrid g;
    g.sign = true;
    g.bits = 1;
    return g;
  };
  a.channel_tensors = [](const Node&) {
    return std::vector<ChannelTensor>{{"shift", false, ChannelRole::kChannel, 0, false}};
  };
  a.sign_shift = [](const Node& n) { return rsign_shift(n); };
  // where(x − shift.view >= 0, +1, −1), as the forward.
  a.torchscript = [](const Node& n, const std::string& x, const TorchScriptTerms& terms) {
    const std::string shift = terms.tensor("shift");
    std::string view = "[1, " + std::to_string(rsign_shift(n).numel()) + "]";
    const std::string d = "(" + x + " - torch.reshape(" + shift + ".to(" + x + ".dtype), " + view + " + [1] * (" + x +
                          ".dim() - 2)))";
    return "torch.where(" + d + " >= 0, torch.ones([], dtype=" + x + ".dtype, device=" + x + ".device), torch.full([], -1.0, dtype=" +
           x + ".dtype, device=" + x + ".device))";
  };
  register_activation_quantizer(std::move(a));
}

}  // namespace

SignGradient sign_gradient_named(const std::string& name) {
  if (name == "ste") return SignGradient::kSte;
  if (name == "approx_sign") return SignGradient::kApproxSign;
  if (name == "ede") return SignGradient::kEde;
  throw Error("sign_gradient '" + name + "' is not one of ste, approx_sign, ede", ErrorKind::kUsage);
}

at::Tensor sign_with_gradient(const at::Tensor& x, SignGradient g, double t) {
  if (g == SignGradient::kSte || !(x.requires_grad() && at::GradMode::is_enabled())) return bnn_sign(x);
  if (!(t > 0.0) || !std::isfinite(t)) throw Error("EDE's t must be a positive number, got " + std::to_string(t));
  return ShapedSignFn::apply(x, static_cast<int64_t>(g), t);
}

double ede_t(double progress, double t_min, double t_max) {
  const double p = std::min(1.0, std::max(0.0, progress));
  return t_min * std::pow(10.0, p * std::log10(t_max / t_min));
}

at::Tensor libra_standardize(const at::Tensor& w, int64_t axis) {
  if (w.dim() < 1 || axis < 0 || axis >= w.dim())
    throw Error("Libra-PB: weight of shape " + shape_str(w.sizes().vec()) + " has no axis " + std::to_string(axis));
  const at::Tensor rows = w.movedim(axis, 0).reshape({w.size(axis), -1});
  std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
  shape[static_cast<size_t>(axis)] = w.size(axis);
  const at::Tensor mean = rows.mean(1).reshape(shape);
  // One value per channel has no unbiased std: it is centred only.
  at::Tensor std = rows.size(1) > 1 ? rows.std(1, /*unbiased=*/true).reshape(shape) : at::zeros(shape, w.options());
  std = at::where(std > 0, std, at::ones({}, std.options()));
  return (w - mean) / std;
}

std::vector<AttrSpec> sign_gradient_attributes() {
  return {AttrSpec::text("sign_gradient", "ste", "the sign's gradient: ste, approx_sign (Bi-Real), ede (IR-Net)")
              .one_of({"ste", "approx_sign", "ede"}),
          AttrSpec::number("ede_t", 1.0, "EDE's t at this point of its schedule").range(1e-6, 1e6)};
}

at::Tensor node_sign(const Node& node, const at::Tensor& x) {
  return sign_with_gradient(x, sign_gradient_named(node.attr_str("sign_gradient")), node.attr_float("ede_t"));
}

void check_binary_options(const std::string& method, const Config& c, const BinaryOptions& o) {
  auto bad = [&](const std::string& what) {
    throw Error("quantize: method '" + method + "', " + what, ErrorKind::kUsage);
  };
  if (o.learned_threshold && c.activation_bits == 32)
    bad("key 'learned_threshold': applies to binary activations (activation_bits 1), not 32");
  for (const char* key : {"ede_t_min", "ede_t_max"})
    if (c.options.contains(key) && o.sign_gradient != "ede")
      bad("key '" + std::string(key) + "': applies with sign_gradient ede only (it is " + o.sign_gradient + ")");
  if (!(o.ede_t_min >= 1e-6 && o.ede_t_min <= 1e6))
    bad("key 'ede_t_min': " + SettingValue(o.ede_t_min).text() + " is not in [1e-06, 1e+06]");
  if (!(o.ede_t_max >= 1e-6 && o.ede_t_max <= 1e6))
    bad("key 'ede_t_max': " + SettingValue(o.ede_t_max).text() + " is not in [1e-06, 1e+06]");
  if (o.ede_t_max < o.ede_t_min)
    bad("key 'ede_t_max': " + SettingValue(o.ede_t_max).text() + " is below ede_t_min " + SettingValue(o.ede_t_min).text());
}

std::optional<ActivationPlan> sign_activation_plan(const Config& c, const BinaryOptions& o) {
  if (c.activation_bits == 32) return std::nullopt;
  ActivationPlan p;
  p.quantizer = o.learned_threshold ? "rsign" : "sign";
  p.attrs["activation_bits"] = int64_t{1};
  p.attrs["sign_gradient"] = o.sign_gradient;
  p.attrs["ede_t"] = o.ede_t_min;
  return p;
}

std::vector<AttrSpec> binary_weight_attributes() {
  std::vector<AttrSpec> a = sign_gradient_attributes();
  a.push_back(AttrSpec::boolean("weight_standardize", false, "Libra-PB: standardize each output channel before the sign"));
  return a;
}

at::Tensor binary_weight_input(const Node& n, const at::Tensor& w) {
  return n.attr_bool("weight_standardize") ? libra_standardize(w, n.attr_int("weight_axis")) : w;
}

void attach_binary_weight(Node& layer, const BinaryOptions& o) {
  // ApproxSign is an activation gradient (Bi-Real Net): on latent weights clipped to ±1 it would
  // be 0 for good. EDE shapes both, as in IR-Net.
  layer.attrs["sign_gradient"] = o.sign_gradient == "ede" ? "ede" : "ste";
  layer.attrs["ede_t"] = o.ede_t_min;
  layer.attrs["weight_standardize"] = int64_t{o.weight_standardize ? 1 : 0};
}

void attach_rsign_shifts(Graph& graph, const std::vector<std::string>& layers) {
  // On the layers' device and dtype, as the weight quantizers' parameters are.
  at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
  for (const auto& name : layers)
    if (const at::Tensor* w = graph.node(name).params.find("weight"); w && w->defined())
      options = options.device(w->device()).dtype(w->scalar_type());
  // Every RSign without its shift: the binarizer may reach its layer through max pooling or
  // flatten, so it is not always the layer's input producer.
  for (Node& a : graph.nodes()) {
    if (a.op != "act_quant" || a.attr_str("method") != "rsign" || a.params.contains("shift")) continue;
    const Shape& shape = graph.value(a.inputs.at(0)).shape;
    if (shape.size() < 2) node_fail(a, "RSign needs an input [N, C, ...], got " + shape_str(shape));
    a.params.set("shift", at::zeros({shape[1]}, options).set_requires_grad(true));
  }
}

int64_t binary_schedule(Graph& graph, const Config& c, const BinaryOptions& o, const std::string& method, double epoch) {
  if (o.sign_gradient != "ede") return 0;
  // Whole epochs done within the span: t changes once an epoch, as IR-Net updates it.
  const double start = c.schedule_start_epoch;
  const double span = c.schedule_end_epoch - start;
  const double progress = span > 0 ? std::floor(epoch - start) / span : 0.0;
  const double t = ede_t(progress, o.ede_t_min, o.ede_t_max);
  int64_t changed = 0;
  auto set = [&](Node& n) {
    if (n.has_attr("ede_t") && n.attr_float("ede_t") == t) return;
    n.attrs["ede_t"] = t;
    ++changed;
  };
  for (auto& n : graph.nodes()) {
    if (n.op == "act_quant" && (n.attr_str("method") == "sign" || n.attr_str("method") == "rsign"))
      set(n);
    else if (!n.weight_transforms.empty() && n.weight_transforms.back() == method)
      set(n);
  }
  return changed;
}

void register_binary_quantizers() { register_rsign(); }

}  // namespace whittle::quantize
