// Ternary weight networks (Li & Liu, 2016, arXiv:1605.04711): the weight quantizer "twn"
// (α·sign(W)·[|W| > Δ], Δ = 0.7·mean|W|) and the method "twn" (ternary weights; activations, when
// quantized, by DoReFa's quantizer). The math is in quantizers.h.

#include "core/error.h"
#include "graph/op_registry.h"
#include "quantize/dorefa.h"

namespace whittle::quantize {

namespace {

// The TWN options a recipe or Config may give.
struct TwnOptions {
  /// DoReFa activations (activation_bits 1..8): the clip level c.
  double activation_clip = 1.0;
  /// Where Δ and α are computed (unset: per_channel).
  std::optional<std::string> granularity;
};

const OptionsSchema<TwnOptions>& twn_schema() {
  using O = TwnOptions;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .add("activation_clip", &O::activation_clip,
               "DoReFa activations: clip level c of c·quantize_k(clip(a, 0, c)/c) (1: the paper's [0, 1])")
          .in_range(Range{0, 1e6, true, false})
          .add("granularity", &O::granularity, "where the threshold Δ and scale α are computed",
               {"per_tensor", "per_channel"}, "per_channel");
  return schema;
}

class TwnMethod final : public MethodWithOptions<TwnOptions> {
 public:
  std::string name() const override { return "twn"; }
  std::string description() const override {
    return "ternary weight networks (Li & Liu 2016): weights α·{−1, 0, +1}; activations float or DoReFa k-bit";
  }
  std::string weight_bits_text() const override { return "2: ternary"; }
  std::string activation_bits_text() const override { return "1..8 or 32"; }

  Config resolve(const Config& in) const override {
    Config c = in;
    if (c.weight_bits == 0) c.weight_bits = 2;
    if (c.activation_bits == 0) c.activation_bits = 32;
    if (c.weight_bits != 2) bad_bits(name(), "weight_bits", c.weight_bits, weight_bits_text());
    if (!dorefa_bits(c.activation_bits)) bad_bits(name(), "activation_bits", c.activation_bits, activation_bits_text());
    check_activation_clip(options(c).activation_clip, c.activation_bits, name());
    return c;
  }
  std::string weight_quantizer(const Config&) const override { return "twn"; }
  void attach_weight(Node& n, const Config& c) const override {
    n.attrs["weight_bits"] = int64_t{2};
    n.attrs["weight_axis"] = weight_output_axis(n).value_or(0);
    n.attrs["granularity"] = options(c).granularity.value_or("per_channel");
  }
  std::optional<ActivationPlan> activations(const Config& c) const override {
    return dorefa_activation_plan(c.activation_bits, options(c).activation_clip);
  }
  std::string label(const Config& c) const override {
    return c.activation_bits == 32 ? "TWN" : "TWN A" + std::to_string(c.activation_bits);
  }

 protected:
  const OptionsSchema<TwnOptions>& schema() const override { return twn_schema(); }
};

}  // namespace

void register_twn() {
  WeightQuantizer w;
  w.name = "twn";
  w.description = "TWN ternary weights (Li & Liu 2016): α·sign(W)·[|W| > Δ], Δ = 0.7·mean|W|";
  w.attributes = weight_quantizer_attributes(2, 2);
  w.attributes.push_back(granularity_attribute(Granularity::kPerChannel));
  w.forward = [](const Node& n, const at::Tensor& w, bool) {
    return twn_weight(w, node_granularity(n), n.attr_int("weight_axis"));
  };
  w.encode = [](const Node& n, const at::Tensor& w) {
    return twn_encode(w, node_granularity(n), n.attr_int("weight_axis"));
  };
  // α·(c − 1): q = c − 1 ∈ {−1, 0, 1} times the per-channel α.
  w.integer_grid = [](const EncodedWeight& e, const Shape& shape) -> std::optional<IntegerGrid> {
    if (e.encoding != Encoding::kTernary) return std::nullopt;
    return channel_grid(e, shape);
  };
  register_weight_quantizer(std::move(w));
  register_quantizer_method(std::make_unique<TwnMethod>());
}

}  // namespace whittle::quantize
