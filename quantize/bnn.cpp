// Binarized neural networks (Hubara et al., 2016, arXiv:1602.02830): the weight quantizer "bnn"
// (sign(W)), the activation quantizer "sign" (the binarizer BNN and XNOR-Net share) and the method
// "bnn", which also clips the latent weights to [−1, 1] after each optimizer step. The math is in
// quantizers.h.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "core/error.h"
#include "graph/op_registry.h"
#include "quantize/binary.h"

namespace whittle::quantize {

namespace {

// The BNN options a recipe or Config may give.
struct BnnOptions : BinaryOptions {
  /// Clip the latent float weights to [−1, 1] after each optimizer step (the paper's rule).
  bool clip_latent_weights = true;
};

const OptionsSchema<BnnOptions>& bnn_schema() {
  using O = BnnOptions;
  static const OptionsSchema<O> schema = [] {
    OptionsSchema<O> s;
    s.add("clip_latent_weights", &O::clip_latent_weights, "clip the latent weights to [-1, 1] after each optimizer step");
    return add_binary_keys(s);
  }();
  return schema;
}

class BnnMethod final : public BinaryMethod<BnnOptions> {
 public:
  std::string name() const override { return "bnn"; }
  std::string description() const override {
    return "binarized neural networks (Hubara et al. 2016): sign weights and sign activations, W1A1";
  }
  void attach_weight(Node& n, const Config& c) const override {
    n.attrs["weight_bits"] = c.weight_bits;
    n.attrs["weight_axis"] = weight_output_axis(n).value_or(0);
    attach_binary_weight(n, options(c));
  }
  int64_t after_step(Graph& graph, const Config& c) const override {
    if (!options(c).clip_latent_weights || c.weight_bits != 1) return 0;
    at::NoGradGuard no_grad;
    int64_t count = 0;
    for (auto& n : graph.nodes()) {
      if (!has_weight_transform(n, "bnn")) continue;
      if (at::Tensor* w = n.params.find("weight"); w && w->defined()) {
        w->clamp_(-1.0, 1.0);
        ++count;
      }
    }
    return count;
  }
  std::string label(const Config&) const override { return "BNN"; }

 protected:
  const OptionsSchema<BnnOptions>& schema() const override { return bnn_schema(); }
};

}  // namespace

void register_bnn() {
  WeightQuantizer w;
  w.name = "bnn";
  w.description = "BNN sign weights (Hubara et al. 2016): sign(W), gradient where |W| ≤ 1";
  w.attributes = weight_quantizer_attributes(1, 1);
  for (AttrSpec& a : binary_weight_attributes()) w.attributes.push_back(std::move(a));
  w.forward = [](const Node& n, const at::Tensor& w, bool) { return node_sign(n, binary_weight_input(n, w)); };
  w.encode = [](const Node& n, const at::Tensor& w) {
    return bnn_encode(binary_weight_input(n, w), n.attr_int("weight_axis"));
  };
  // s·(2c − 1): q = ±1 times the scale (1).
  w.integer_grid = [](const EncodedWeight& e, const Shape& shape) -> std::optional<IntegerGrid> {
    if (e.encoding != Encoding::kSign) return std::nullopt;
    return channel_grid(e, shape);
  };
  register_weight_quantizer(std::move(w));

  ActivationQuantizer a;
  a.name = "sign";
  a.description = "binarizer sign(x), sign(0) = +1, gradient where |x| ≤ 1 (BNN, XNOR-Net activations)";
  a.placement = Placement::kBinarizeReluInput;
  a.attributes = sign_gradient_attributes();
  a.attributes.insert(a.attributes.begin(),
                      AttrSpec::integer("activation_bits", 1, "bits per activation: 1, the sign").range(1, 1));
  a.check = [](const Node&) {};
  a.forward = [](const Node& n, const at::Tensor& x, bool) { return node_sign(n, x); };
  a.grid = [](const Node&) {
    ActivationGrid g;
    g.sign = true;
    g.bits = 1;
    return g;
  };
  // where(x >= 0, +1, −1) in the input's dtype and device, as bnn_sign.
  a.torchscript = [](const Node&, const std::string& x, const TorchScriptTerms&) {
    return "torch.where(" + x + " >= 0, torch.ones([], dtype=" + x + ".dtype, device=" + x +
           ".device), torch.full([], -1.0, dtype=" + x + ".dtype, device=" + x + ".device))";
  };
  register_activation_quantizer(std::move(a));
  register_quantizer_method(std::make_unique<BnnMethod>());
  register_binary_quantizers();
}

}  // namespace whittle::quantize
