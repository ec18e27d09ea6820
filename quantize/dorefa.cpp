// DoReFa-Net (Zhou et al., 2016, arXiv:1606.06160): the weight quantizer "dorefa" (k-bit tanh-
// normalized grids, 1-bit sign·mean|W|), the activation quantizer "dorefa" (c·quantize_k(clip(x, 0,
// c)/c)) and the method "dorefa" that attaches both. The math is in quantizers.h.

#include <cmath>

#include "core/error.h"
#include "graph/op_registry.h"
#include "quantize/dorefa.h"

namespace whittle::quantize {

namespace {

// The DoReFa options a recipe or Config may give.
struct DoReFaOptions {
  /// Activations: the clip level c of c·quantize_k(clip(a, 0, c)/c) (1: the paper's [0, 1]).
  double activation_clip = 1.0;
  /// Scale granularity of 1-bit weights and of the max|tanh| of k-bit ones (unset: per_tensor).
  std::optional<std::string> granularity;
};

const OptionsSchema<DoReFaOptions>& dorefa_schema() {
  using O = DoReFaOptions;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .add("activation_clip", &O::activation_clip,
               "DoReFa activations: clip level c of c·quantize_k(clip(a, 0, c)/c) (1: the paper's [0, 1])")
          .in_range(Range{0, 1e6, true, false})
          .add("granularity", &O::granularity, "where the scale of 1-bit weights and the tanh maximum of k-bit ones are computed",
               {"per_tensor", "per_channel"}, "per_tensor");
  return schema;
}

}  // namespace

void register_dorefa_activation() {
  ActivationQuantizer a;
  a.name = "dorefa";
  a.description =
      "DoReFa activations c·quantize_k(clip(x, 0, c)/c) (Zhou et al. 2016): activation_bits k, activation_clip c "
      "(default 1); relu 1: stands for a ReLU then the quantizer";
  a.placement = Placement::kAfterRelu;
  a.attributes = {
      AttrSpec::needed("activation_bits", AttrType::kInt, "bits per activation (1..8; 32: float)")
          .range(1, 32)
          .checked([](const Node&, const Attr& v) {
            return dorefa_bits(std::get<int64_t>(v)) ? "" : "is " + attr_str(v) + ", not 1..8 or 32";
          }),
      AttrSpec::number("activation_clip", 1.0, "clip level c of c·quantize_k(clip(x, 0, c)/c)").range(1e-30, std::nullopt),
      AttrSpec::boolean("relu", false, "stands for a ReLU then the quantizer")};
  a.check = [](const Node&) {};
  a.forward = [](const Node& n, const at::Tensor& x, bool) {
    return dorefa_activation(x, n.attr_int("activation_bits"), n.attr_float("activation_clip"),
                             n.attr_bool("relu"));
  };
  a.grid = [](const Node& n) {
    ActivationGrid g;
    g.bits = n.attr_int("activation_bits");
    g.max = n.attr_float("activation_clip");
    g.relu = n.attr_bool("relu");
    return g;
  };
  a.torchscript = [](const Node& n, const std::string& x, const TorchScriptTerms& t) -> std::string {
    const int64_t bits = n.attr_int("activation_bits");
    // relu = 1: the quantizer stands for a ReLU then itself (same values below 32 bits).
    if (bits == 32) return n.attr_int("relu") ? "torch.relu(" + x + ")" : x;
    // dorefa_activation's values: quantize_k(clamp(x, 0, 1)), or quantize_k(clamp(x, 0, c) / c)·c.
    const std::string levels = t.number(static_cast<double>((int64_t{1} << bits) - 1));
    const double c = n.attr_float("activation_clip");
    if (c == 1.0) return "torch.round(torch.clamp(" + x + ", 0.0, 1.0) * " + levels + ") / " + levels;
    const std::string cs = t.number(c);
    return "torch.round(torch.clamp(" + x + ", 0.0, " + cs + ") / " + cs + " * " + levels + ") / " + levels + " * " + cs;
  };
  register_activation_quantizer(std::move(a));
}

namespace {

class DoReFaMethod final : public MethodWithOptions<DoReFaOptions> {
 public:
  std::string name() const override { return "dorefa"; }
  std::string description() const override {
    return "DoReFa-Net (Zhou et al. 2016): k-bit tanh-normalized weights, activations quantized on [0, c]; W8A8 by default";
  }
  std::string weight_bits_text() const override { return "1..8 or 32"; }
  std::string activation_bits_text() const override { return "1..8 or 32"; }

  Config resolve(const Config& in) const override {
    Config c = in;
    if (c.weight_bits == 0) c.weight_bits = 8;
    if (c.activation_bits == 0) c.activation_bits = 8;
    if (!dorefa_bits(c.weight_bits)) bad_bits(name(), "weight_bits", c.weight_bits, weight_bits_text());
    if (!dorefa_bits(c.activation_bits)) bad_bits(name(), "activation_bits", c.activation_bits, activation_bits_text());
    const DoReFaOptions o = options(c);
    check_activation_clip(o.activation_clip, c.activation_bits, name());
    return c;
  }
  std::string weight_quantizer(const Config& c) const override { return c.weight_bits == 32 ? "" : "dorefa"; }
  void attach_weight(Node& n, const Config& c) const override {
    n.attrs["weight_bits"] = c.weight_bits;
    n.attrs["weight_axis"] = weight_output_axis(n).value_or(0);
    n.attrs["granularity"] = options(c).granularity.value_or("per_tensor");
  }
  std::optional<ActivationPlan> activations(const Config& c) const override {
    return dorefa_activation_plan(c.activation_bits, options(c).activation_clip);
  }
  std::string label(const Config& c) const override {
    return "DoReFa W" + std::to_string(c.weight_bits) + "A" + std::to_string(c.activation_bits);
  }

 protected:
  const OptionsSchema<DoReFaOptions>& schema() const override { return dorefa_schema(); }
};

}  // namespace

void check_activation_clip(double clip, int64_t activation_bits, const std::string& method) {
  if (!(clip > 0) || !std::isfinite(clip))
    throw Error("quantize: activation_clip = " + number_text(clip) + " (expected a finite value > 0)");
  if (clip != 1.0 && activation_bits == 32)
    throw Error("quantize: activation_clip applies to DoReFa activations only (activation_bits 1..8), not to method '" +
                method + "' with activation_bits 32");
}

std::optional<ActivationPlan> dorefa_activation_plan(int64_t activation_bits, double activation_clip) {
  if (activation_bits == 32) return std::nullopt;
  ActivationPlan p;
  p.quantizer = "dorefa";
  p.attrs["activation_bits"] = activation_bits;
  if (activation_clip != 1.0) p.attrs["activation_clip"] = activation_clip;
  return p;
}

void register_dorefa() {
  WeightQuantizer w;
  w.name = "dorefa";
  w.description = "DoReFa weights (Zhou et al. 2016): weight_bits 2..8 tanh-normalized grids, 1: sign(W)·mean|W|";
  w.attributes = weight_quantizer_attributes(1, 8);
  w.attributes.push_back(granularity_attribute(Granularity::kPerTensor));
  w.forward = [](const Node& n, const at::Tensor& w, bool) {
    return dorefa_weight(w, n.attr_int("weight_bits"), node_granularity(n), n.attr_int("weight_axis"));
  };
  w.encode = [](const Node& n, const at::Tensor& w) {
    return dorefa_encode(w, n.attr_int("weight_bits"), node_granularity(n), n.attr_int("weight_axis"));
  };
  // A k-bit DoReFa value s·(2c/(2^k − 1) − 1) = (2c − (2^k − 1))·s/(2^k − 1): an odd integer in
  // [−(2^k − 1), 2^k − 1] (|q| ≤ 127 for k ≤ 7) times a per-channel scale (equal to the decoded
  // value up to float32 rounding).
  w.integer_grid = [](const EncodedWeight& e, const Shape& shape) -> std::optional<IntegerGrid> {
    if (e.encoding == Encoding::kSign) return channel_grid(e, shape);  // 1 bit: s·(2c − 1), q = ±1
    if (e.encoding != Encoding::kDoReFa || e.bits < 2 || e.bits > 7) return std::nullopt;
    return channel_grid(e, shape, static_cast<double>((int64_t{1} << e.bits) - 1));
  };
  register_weight_quantizer(std::move(w));
  register_dorefa_activation();
  register_quantizer_method(std::make_unique<DoReFaMethod>());
}

}  // namespace whittle::quantize
