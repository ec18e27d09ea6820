// PACT (Choi et al., 2018, arXiv:1805.06085): the activation quantizer "pact", a learned clip level
// α per layer input, and the method "pact" (DoReFa k-bit weights, PACT activations, the L2 penalty
// λ·Σα² added to the loss).
//
//   y = round(min(max(x, 0), α)/s)·s,  s = α/(2^k − 1) (computed in double, rounded to x's dtype)
//   ∂y/∂x = 1 where 0 ≤ x < α (0 < x < α when it stands for a ReLU too), else 0
//   ∂y/∂α = 1 where x ≥ α, else 0 (the paper's straight-through estimate)
// α below a floor quantizes with the floor (its gradient passes unchanged) and is clamped to it
// after each optimizer step.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "graph/op_registry.h"
#include "quantize/fused_quantizers.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "quantize/quantizers.h"
#ifdef WHITTLE_WITH_CUDA
#include "quantize/fused_quantizers_cuda.h"
#endif

namespace whittle::quantize {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

constexpr double kClipFloor = 1e-6;

// The levels 2^k − 1 of a k-bit PACT grid; throws for k outside 1..8.
double pact_levels(int64_t bits) {
  if (bits < 1 || bits > 8) throw Error("PACT activations: unsupported bit width " + std::to_string(bits) + " (1..8)");
  return static_cast<double>((int64_t{1} << bits) - 1);
}

struct PactFn : public torch::autograd::Function<PactFn> {
  static Variable forward(AutogradContext* ctx, const Variable& x, const Variable& alpha, int64_t bits, bool after_relu) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor a = alpha.detach().reshape({}).clamp_min(kClipFloor);
    const at::Tensor s = (a.to(at::kDouble) / pact_levels(bits)).to(x.scalar_type());
    const at::Tensor ax = a.to(x.scalar_type());
    ctx->save_for_backward({x, ax});
    ctx->saved_data["after_relu"] = after_relu;
    // One pass on the CPU (quantize/fused_quantizers.h), one CUDA kernel when the CUDA kernels are
    // on (quantize/fused_quantizers_cuda.h), the ATen ops otherwise.
    const bool fused = x.is_cpu() && fused_quantizers_take(x);
    const bool fused_cuda = x.is_cuda() && fused_quantizers_take(x) && ax.device() == x.device();
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["fused_cuda"] = fused_cuda;
    if (fused) return fused::pact(x, ax.item<float>(), s.item<float>());
#ifdef WHITTLE_WITH_CUDA
    if (fused_cuda) return fused::cuda::pact(x, ax, s);
#endif
    return at::round(at::minimum(at::clamp_min(x, 0.0), ax) / s) * s;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& a = saved[1];
    if (ctx->saved_data["fused"].toBool()) {
      auto [grad_x, sum] = fused::pact_backward(grad[0], x, a.item<float>(), ctx->saved_data["after_relu"].toBool());
      return {grad_x, at::full({1}, sum, at::TensorOptions().dtype(at::kFloat)), Variable(), Variable()};
    }
#ifdef WHITTLE_WITH_CUDA
    // (A gradient in another layout would order the ATen form's sum otherwise: it takes that.)
    if (ctx->saved_data["fused_cuda"].toBool() && grad[0].is_contiguous()) {
      // The kernel's terms are the ATen form's products, summed as it sums them.
      auto [grad_x, terms] = fused::cuda::pact_backward(grad[0], x, a, ctx->saved_data["after_relu"].toBool());
      return {grad_x, terms.sum().reshape({1}), Variable(), Variable()};
    }
#endif
    const at::Tensor low = ctx->saved_data["after_relu"].toBool() ? x > 0 : x >= 0;
    const at::Tensor above = x >= a;
    const at::Tensor grad_x = grad[0] * at::logical_and(low, at::logical_not(above));
    const at::Tensor grad_alpha = (grad[0].to(at::kFloat) * above).sum().reshape({1});  // float32 sum, as for LSQ
    return {grad_x, grad_alpha, Variable(), Variable()};
  }
};

const at::Tensor& act_clip(const Node& n) {
  const at::Tensor* a = n.params.find("act_clip");
  if (!a || !a->defined() || a->numel() != 1) node_fail(n, "PACT activations need a learned parameter 'act_clip' of one element");
  return *a;
}

// The PACT options a recipe or Config may give.
struct PactOptions {
  /// The clip level α every quantized layer input starts from (unset: the paper's 10).
  std::optional<double> clip_init;
  /// A calibrator (quantize/calibrate.h) that sets each α from the layer's inputs over
  /// init_batches training batches instead (α = the calibrator's step · (2^k − 1)).
  std::optional<std::string> clip_calibrator;
  int64_t init_batches = 1;  ///< training batches the statistics come from, with clip_calibrator
  /// λ of the L2 penalty λ·Σα² added to the training loss (0: none).
  double clip_penalty = 0.0;
  /// DoReFa weights: where the tanh maximum of k-bit weights and the 1-bit scale are computed.
  std::optional<std::string> granularity;
};

const OptionsSchema<PactOptions>& pact_schema() {
  using O = PactOptions;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .add("clip_init", &O::clip_init, "the clip level α each quantized layer input starts from", {}, "10")
          .in_range(Range{0, 1e6, true, false})
          .add("clip_calibrator", &O::clip_calibrator,
               "a calibrator (whittle inspect --calibrators: minmax, percentile, mse) that sets each α from the layer's "
               "inputs over init_batches training batches, instead of clip_init")
          .add("init_batches", &O::init_batches, "training batches the clip_calibrator's statistics come from")
          .in_range(Range::closed(1, 10000))
          .add("clip_penalty", &O::clip_penalty, "λ of the L2 penalty λ·Σα² added to the loss")
          .in_range(Range::at_least(0))
          .add("granularity", &O::granularity, "DoReFa weights: where the tanh maximum (k-bit) or scale (1-bit) is computed",
               {"per_tensor", "per_channel"}, "per_tensor");
  return schema;
}

class PactMethod final : public MethodWithOptions<PactOptions> {
 public:
  std::string name() const override { return "pact"; }
  std::string description() const override {
    return "PACT (Choi et al. 2018): activations clipped at a learned α per layer and quantized to k bits, DoReFa "
           "k-bit weights; W4A4 by default";
  }
  std::string weight_bits_text() const override { return "1..8 or 32"; }
  std::string activation_bits_text() const override { return "1..8"; }

  Config resolve(const Config& in) const override {
    Config c = in;
    if (c.weight_bits == 0) c.weight_bits = 4;
    if (c.activation_bits == 0) c.activation_bits = 4;
    if (!dorefa_bits(c.weight_bits)) bad_bits(name(), "weight_bits", c.weight_bits, weight_bits_text());
    if (c.activation_bits < 1 || c.activation_bits > 8)
      bad_bits(name(), "activation_bits", c.activation_bits, activation_bits_text());
    const PactOptions o = options(c);
    auto refuse = [&](const std::string& key, const std::string& why) {
      throw Error("quantize: method 'pact', key '" + key + "': " + why, ErrorKind::kUsage);
    };
    if (o.clip_calibrator && !calibrators().contains(*o.clip_calibrator)) {
      std::string known;
      for (const auto& k : calibrators().names()) known += (known.empty() ? "" : ", ") + k;
      refuse("clip_calibrator", "unknown '" + *o.clip_calibrator + "' (" + known + ")");
    }
    if (o.clip_calibrator && o.clip_init) refuse("clip_init", "give clip_init or clip_calibrator, not both");
    if (!o.clip_calibrator && o.init_batches != 1)
      refuse("init_batches", std::to_string(o.init_batches) + " batches need a clip_calibrator");
    return c;
  }
  std::optional<Calibration> calibration(const Config& c) const override {
    const PactOptions o = options(c);
    if (!o.clip_calibrator) return std::nullopt;
    Calibration cal;
    cal.calibrator = *o.clip_calibrator;
    cal.batches = o.init_batches;
    return cal;
  }
  std::string weight_quantizer(const Config& c) const override { return c.weight_bits == 32 ? "" : "dorefa"; }
  void attach_weight(Node& n, const Config& c) const override {
    n.attrs["weight_bits"] = c.weight_bits;
    n.attrs["weight_axis"] = weight_output_axis(n).value_or(0);
    n.attrs["granularity"] = options(c).granularity.value_or("per_tensor");
  }
  std::optional<ActivationPlan> activations(const Config& c) const override {
    ActivationPlan p;
    p.quantizer = "pact";
    p.attrs["activation_bits"] = c.activation_bits;
    p.attrs["clip_init"] = options(c).clip_init.value_or(10.0);
    return p;
  }
  // α below the floor comes back to it (a clamp of every clip level, without reading it back).
  int64_t after_step(Graph& graph, const Config&) const override {
    at::NoGradGuard no_grad;
    int64_t clamped = 0;
    for (Node& n : graph.nodes()) {
      if (n.op != "act_quant" || n.attr_str("method") != name()) continue;
      act_clip(n).clamp_min_(kClipFloor);
      ++clamped;
    }
    return clamped;
  }
  // λ·Σα² over the clip levels of this entry's layers' inputs (another entry's λ covers its own).
  at::Tensor penalty(const Graph& graph, const Config& c) const override {
    const double lambda = options(c).clip_penalty;
    if (lambda == 0) return {};
    at::Tensor sum;
    std::set<std::string> seen;
    for (const auto& layer : selected_layers(graph, c)) {
      const std::string& producer = graph.value(graph.node(layer).inputs.at(0)).producer;
      if (producer.empty() || !seen.insert(producer).second) continue;
      const Node& n = graph.node(producer);
      if (n.op != "act_quant" || n.attr_str("method") != name()) continue;
      const at::Tensor term = act_clip(n).pow(2).sum();
      sum = sum.defined() ? sum + term : term;
    }
    return sum.defined() ? sum * lambda : sum;
  }
  std::string label(const Config& c) const override {
    return "PACT W" + std::to_string(c.weight_bits) + "A" + std::to_string(c.activation_bits);
  }

 protected:
  const OptionsSchema<PactOptions>& schema() const override { return pact_schema(); }
};

}  // namespace

void register_pact() {
  ActivationQuantizer a;
  a.name = "pact";
  a.description = "PACT activations (Choi et al. 2018): round(clip(x, 0, α)/s)·s, s = α/(2^k − 1), learned α (act_clip)";
  a.placement = Placement::kAfterRelu;
  a.params = {"act_clip"};
  a.attributes = {AttrSpec::needed("activation_bits", AttrType::kInt, "bits per activation (1..8)").range(1, 8),
                  AttrSpec::number("clip_init", 10.0, "the clip level α starts from").range(1e-30, std::nullopt),
                  AttrSpec::boolean("relu", false, "stands for a ReLU then the quantizer")};
  a.check = [](const Node&) {};
  a.forward = [](const Node& n, const at::Tensor& x, bool) {
    return PactFn::apply(x, act_clip(n), n.attr_int("activation_bits"), n.attr_bool("relu"));
  };
  a.grid = [](const Node& n) {
    ActivationGrid g;
    g.bits = n.attr_int("activation_bits");
    // As the forward: α clamped in float32, then widened.
    g.max = static_cast<double>(std::max(act_clip(n).detach().to(at::kCPU, at::kFloat).item<float>(), static_cast<float>(kClipFloor)));
    g.relu = n.attr_bool("relu");
    return g;
  };
  a.torchscript = [](const Node& n, const std::string& x, const TorchScriptTerms& t) -> std::string {
    const std::string alpha = "torch.clamp(" + t.tensor("act_clip") + ".reshape([]), min=" + t.number(kClipFloor) + ")";
    const std::string s = "(" + alpha + ".double() / " + t.number(pact_levels(n.attr_int("activation_bits"))) +
                          ").to(" + x + ".dtype)";
    return "torch.round(torch.minimum(torch.clamp(" + x + ", min=0.0), " + alpha + ".to(" + x + ".dtype)) / " + s +
           ") * " + s;
  };
  a.attach = [](Node& n) {
    n.params.set("act_clip", at::full({1}, n.attr_float("clip_init"), at::kFloat).set_requires_grad(true));
  };
  // α = the calibrator's step for the grid [0, 2^k − 1] times 2^k − 1.
  a.calibrate = [](const Node& n, const Histogram& h, const Calibrator& c, const CalibrationOptions& o) {
    at::NoGradGuard no_grad;
    const int64_t levels = (int64_t{1} << n.attr_int("activation_bits")) - 1;
    act_clip(n).fill_(std::max(c.step(h, {0, levels, 0.0}, o) * static_cast<double>(levels), kClipFloor));
  };
  register_activation_quantizer(std::move(a));
  register_quantizer_method(std::make_unique<PactMethod>());
}

}  // namespace whittle::quantize
