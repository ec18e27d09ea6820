// Learned Step Size Quantization (Esser et al., 2020, arXiv:1902.08153): the weight quantizer "lsq"
// (a learned step per tensor or per output channel on the signed grid), the activation quantizer
// "lsq" (a learned step per layer input on the unsigned grid) and the method "lsq" that attaches
// both. The math is in lsq.h.

#include "quantize/lsq.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "graph/op_registry.h"
#include "quantize/fused_quantizers.h"
#include "quantize/method.h"
#include "quantize/quantizers.h"
#ifdef WHITTLE_WITH_CUDA
#include "quantize/fused_quantizers_cuda.h"
#endif

namespace whittle::quantize {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

LsqGrid lsq_signed_grid(int64_t bits) {
  if (bits < 2 || bits > 8) throw Error("LSQ weights: unsupported bit width " + std::to_string(bits) + " (2..8)");
  return {int64_t{1} << (bits - 1), (int64_t{1} << (bits - 1)) - 1};
}

LsqGrid lsq_unsigned_grid(int64_t bits) {
  if (bits < 1 || bits > 8) throw Error("LSQ activations: unsupported bit width " + std::to_string(bits) + " (1..8)");
  return {0, (int64_t{1} << bits) - 1};
}

double lsq_step_floor(at::ScalarType dtype) { return dtype == at::kHalf ? 6.103515625e-05 : 1e-8; }

double lsq_gradient_scale(int64_t elements, int64_t q_p) {
  if (elements <= 0 || q_p <= 0) return 1.0;
  return 1.0 / std::sqrt(static_cast<double>(elements) * static_cast<double>(q_p));
}

namespace {

// `step` [1] or [C] as a tensor broadcasting against x along `axis`.
at::Tensor step_along(const at::Tensor& x, const at::Tensor& step, int64_t axis) {
  if (step.numel() == 1) return step.reshape({});
  if (x.dim() < 1 || axis < 0 || axis >= x.dim() || step.numel() != x.size(axis))
    throw Error("LSQ: a step of " + std::to_string(step.numel()) + " elements fits neither a tensor of shape " +
                shape_str(x.sizes().vec()) + " (1) nor its channels along axis " + std::to_string(axis));
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(axis)] = step.numel();
  return step.reshape(shape);
}

// Sums `t` (x's shape) to the step's shape: everything, or all but `axis`.
at::Tensor sum_to_step(const at::Tensor& t, const at::Tensor& step, int64_t axis) {
  if (step.numel() == 1) return t.sum().reshape(step.sizes());
  return t.movedim(axis, 0).reshape({step.numel(), -1}).sum(1).reshape(step.sizes());
}

// The step quantization uses: max(step, floor) in x's dtype, shaped against x.
at::Tensor effective_step(const at::Tensor& x, const at::Tensor& step, int64_t axis) {
  return step_along(x, step.detach().to(x.scalar_type()).clamp_min(lsq_step_floor(x.scalar_type())), axis);
}

// Whether the CUDA kernels of quantize/fused_quantizers_cuda.h take x with the step s and offset b
// (undefined: none) on its device. (On the host, a 0-dim step is a scalar that ATen's CUDA division
// multiplies by as a reciprocal: the ATen form then keeps it.)
bool on_fused_cuda(const at::Tensor& x, const at::Tensor& s, const at::Tensor& b) {
  return x.is_cuda() && fused_quantizers_take(x) && s.device() == x.device() && (!b.defined() || b.device() == x.device());
}

struct LsqFn : public torch::autograd::Function<LsqFn> {
  static Variable forward(AutogradContext* ctx, const Variable& x, const Variable& step, const Variable& offset,
                          int64_t q_n, int64_t q_p, double gradient_scale, int64_t axis) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor s = effective_step(x, step, axis);
    // An offset of no elements stands for none (autograd functions take no undefined inputs).
    const at::Tensor b = offset.numel() == 1 ? offset.detach().to(x.scalar_type()).reshape({}) : at::Tensor();
    ctx->save_for_backward({x, s, step, offset});
    ctx->saved_data["q_n"] = q_n;
    ctx->saved_data["q_p"] = q_p;
    ctx->saved_data["gradient_scale"] = gradient_scale;
    ctx->saved_data["axis"] = axis;
    // One pass on the CPU for a step per tensor (quantize/fused_quantizers.h), one CUDA kernel for
    // any step when the CUDA kernels are on, the ATen ops otherwise.
    const bool fused = x.is_cpu() && fused_quantizers_take(x) && step.numel() == 1;
    ctx->saved_data["fused"] = fused;
    const bool fused_cuda = on_fused_cuda(x, s, b);
    ctx->saved_data["fused_cuda"] = fused_cuda;
#ifdef WHITTLE_WITH_CUDA
    if (fused_cuda) return fused::cuda::lsq(x, s, b, q_n, q_p, axis);
#endif
    if (fused) {
      // The step and offset as the kernels take them, kept for the backward pass.
      const float s_value = s.item<float>(), b_value = b.defined() ? b.item<float>() : 0.0f;
      ctx->saved_data["step_value"] = static_cast<double>(s_value);
      ctx->saved_data["offset_value"] = static_cast<double>(b_value);
      return fused::lsq(x, s_value, b_value, b.defined(), q_n, q_p);
    }
    const at::Tensor shifted = b.defined() ? x - b : x;
    const at::Tensor y = at::round(at::clamp(shifted / s, -static_cast<double>(q_n), static_cast<double>(q_p))) * s;
    return b.defined() ? y + b : y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& s = saved[1];
    const at::Tensor& step = saved[2];
    const at::Tensor& offset = saved[3];
    const double q_n = static_cast<double>(ctx->saved_data["q_n"].toInt());
    const double q_p = static_cast<double>(ctx->saved_data["q_p"].toInt());
    const double g_scale = ctx->saved_data["gradient_scale"].toDouble();
    const bool has_offset = offset.numel() == 1;
    if (ctx->saved_data["fused"].toBool()) {
      const fused::LsqGradients r = fused::lsq_backward(
          grad[0], x, static_cast<float>(ctx->saved_data["step_value"].toDouble()),
          static_cast<float>(ctx->saved_data["offset_value"].toDouble()), has_offset, static_cast<int64_t>(q_n),
          static_cast<int64_t>(q_p));
      at::Tensor grad_step, grad_offset;
      if (step.requires_grad()) grad_step = at::full(step.sizes(), r.step * g_scale, step.options());
      if (has_offset && offset.requires_grad()) grad_offset = at::full(offset.sizes(), r.offset * g_scale, offset.options());
      return {r.input, grad_step, grad_offset, Variable(), Variable(), Variable(), Variable()};
    }
#ifdef WHITTLE_WITH_CUDA
    // (A gradient in another layout would order the ATen form's sums otherwise: it takes that.)
    if (ctx->saved_data["fused_cuda"].toBool() && grad[0].is_contiguous()) {
      // The kernel's per-element terms are the ATen form's products; summed as it sums them.
      const at::Tensor b = has_offset ? offset.detach().to(x.scalar_type()).reshape({}) : at::Tensor();
      const fused::cuda::LsqTerms t = fused::cuda::lsq_backward(grad[0], x, s, b, static_cast<int64_t>(q_n),
                                                                static_cast<int64_t>(q_p), ctx->saved_data["axis"].toInt());
      at::Tensor grad_step, grad_offset;
      if (step.requires_grad())
        grad_step = (sum_to_step(t.step, step, ctx->saved_data["axis"].toInt()) * g_scale).to(step.scalar_type());
      if (has_offset && offset.requires_grad())
        grad_offset = (t.offset.sum() * g_scale).reshape(offset.sizes()).to(offset.scalar_type());
      return {t.input, grad_step, grad_offset, Variable(), Variable(), Variable(), Variable()};
    }
#endif
    const at::Tensor v = (has_offset ? x - offset.detach().to(x.scalar_type()).reshape({}) : x) / s;
    const at::Tensor below = v <= -q_n, above = v >= q_p;
    const at::Tensor inside = at::logical_not(at::logical_or(below, above));
    const at::Tensor& g = grad[0];
    // ∂x̂/∂s per element: round(v) − v inside, the bound it is clamped to outside.
    const at::Tensor ds = at::where(inside, at::round(v) - v, at::where(below, at::full({}, -q_n, v.options()),
                                                                         at::full({}, q_p, v.options())));
    at::Tensor grad_step, grad_offset;
    // Summed in float32 at least (half-precision sums over a layer's activations overflow).
    const at::Tensor g32 = g.scalar_type() == at::kDouble ? g : g.to(at::kFloat);
    if (step.requires_grad())
      grad_step = (sum_to_step(g32 * ds, step, ctx->saved_data["axis"].toInt()) * g_scale).to(step.scalar_type());
    if (has_offset && offset.requires_grad())
      grad_offset = ((g32 * at::logical_not(inside)).sum() * g_scale).reshape(offset.sizes()).to(offset.scalar_type());
    return {g * inside, grad_step, grad_offset, Variable(), Variable(), Variable(), Variable()};
  }
};

}  // namespace

at::Tensor lsq_quantize(const at::Tensor& x, const at::Tensor& step, LsqGrid grid, double gradient_scale,
                        int64_t axis, const at::Tensor& offset) {
  if (offset.defined() && offset.numel() != 1)
    throw Error("LSQ+: an offset of " + std::to_string(offset.numel()) + " elements (expected 1)");
  return LsqFn::apply(x, step, offset.defined() ? offset : at::empty({0}, step.options().requires_grad(false)), grid.q_n,
                      grid.q_p, gradient_scale, axis);
}

namespace {

// mean|x| as float, [1] over the whole tensor or [C] per channel along `axis`; no gradient.
at::Tensor abs_means(const at::Tensor& x_in, bool per_channel, int64_t axis) {
  at::NoGradGuard no_grad;
  const at::Tensor x = x_in.detach().abs().to(at::kFloat);
  if (!per_channel) return x.mean().reshape({1});
  if (x.dim() < 1 || axis < 0 || axis >= x.dim())
    throw Error("LSQ: channel axis " + std::to_string(axis) + " out of range for shape " + shape_str(x.sizes().vec()));
  return x.movedim(axis, 0).reshape({x.size(axis), -1}).mean(1);
}

}  // namespace

at::Tensor lsq_initial_step(const at::Tensor& x_in, LsqGrid grid, bool per_channel, int64_t axis) {
  const at::Tensor mean = abs_means(x_in, per_channel, axis);
  const double q_p = static_cast<double>(std::max<int64_t>(grid.q_p, 1));
  return (mean * (2.0 / std::sqrt(q_p))).clamp_min(lsq_step_floor(at::kFloat));
}

EncodedWeight lsq_encode(const at::Tensor& w_in, const at::Tensor& step, int64_t bits, int64_t axis) {
  const LsqGrid grid = lsq_signed_grid(bits);
  at::NoGradGuard no_grad;
  const at::Tensor w = w_in.detach();
  const at::Tensor s = effective_step(w, step, axis);
  EncodedWeight e;
  e.codes = at::round(at::clamp(w / s, -static_cast<double>(grid.q_n), static_cast<double>(grid.q_p))) +
            static_cast<double>(grid.q_n);
  e.scale = s.reshape({-1}).to(at::kFloat).contiguous();
  e.encoding = Encoding::kUniform;
  e.bits = bits;
  e.axis = axis;
  return e;
}

namespace {

// The LSQ options a recipe or Config may give.
struct LsqOptions {
  /// Weights: one learned step per tensor or per output channel (unset: per_tensor, the paper's).
  std::optional<std::string> granularity;
  /// How the steps start: "paper" (2·mean|x|/√Q_P; activations from the first batch) or a
  /// registered calibrator (quantize/calibrate.h) over the weights and over init_batches batches.
  std::string step_init = "paper";
  int64_t init_batches = 1;  ///< training batches the activation statistics come from (a calibrator)
  /// The percentile calibrator's share of the values, in percent (unset: 99.99; only with it).
  std::optional<double> percentile;
};

const OptionsSchema<LsqOptions>& lsq_schema() {
  using O = LsqOptions;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .add("granularity", &O::granularity, "one learned weight step per tensor or per output channel",
               {"per_tensor", "per_channel"}, "per_tensor")
          .add("step_init", &O::step_init,
               "how the steps start: paper (2·mean|x|/√Q_P, activations from the first batch) or a calibrator "
               "(whittle inspect --calibrators: minmax, percentile, mse) over the weights and init_batches batches")
          .add("init_batches", &O::init_batches,
               "training batches the activation statistics come from, with a step_init calibrator")
          .in_range(Range::closed(1, 10000))
          .add("percentile", &O::percentile, "step_init percentile: the share of the values the grid covers, in percent",
               {}, "99.99")
          .in_range(Range{0, 100, true, false});
  return schema;
}

// The calibration the options ask for; nullopt for the paper's rule.
std::optional<Calibration> calibration_of(const LsqOptions& o) {
  if (o.step_init == "paper") return std::nullopt;
  Calibration c;
  c.calibrator = o.step_init;
  c.batches = o.init_batches;
  if (o.percentile) c.options.percentile = *o.percentile;
  return c;
}

// The step of `w` for the signed grid of `bits` from calibrator `c`: [1], or [C] per channel along
// `axis`; at least the floor. No gradient.
at::Tensor calibrated_weight_step(const Node& n, const at::Tensor& w_in, int64_t bits, const Calibration& cal,
                                  bool per_channel, int64_t axis) {
  at::NoGradGuard no_grad;
  const Calibrator& c = calibrator(cal.calibrator);
  const LsqGrid grid = lsq_signed_grid(bits);
  const CalibrationGrid g{grid.q_n, grid.q_p, 0.0};
  const at::Tensor w = w_in.detach().to(at::kCPU, at::kFloat);
  std::vector<at::Tensor> rows;
  if (per_channel) {
    const at::Tensor by_channel = w.movedim(axis, 0).reshape({w.size(axis), -1});
    for (int64_t i = 0; i < by_channel.size(0); ++i) rows.push_back(by_channel[i]);
  } else {
    rows.push_back(w);
  }
  std::vector<float> steps;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string what =
        "node '" + n.name + "' (" + n.op + "): weight" + (per_channel ? " channel " + std::to_string(i) : std::string());
    steps.push_back(static_cast<float>(
        std::max(c.step(histogram_of(rows[i], what), g, cal.options), lsq_step_floor(at::kFloat))));
  }
  return at::tensor(steps, at::kFloat);
}

bool lsq_weight_bits(int64_t k) { return (k >= 2 && k <= 8) || k == 32; }

// The elements one weight step quantizes: the tensor's, or one output channel's.
int64_t weight_elements(const Node& n, const at::Tensor& w) {
  if (node_granularity(n) == Granularity::kPerTensor) return w.numel();
  const int64_t axis = n.attr_int("weight_axis");
  return axis < w.dim() && w.size(axis) > 0 ? w.numel() / w.size(axis) : w.numel();
}

// The weight a step quantizes changed from `old_w` to `new_w` (QAT BN folding put W·γ/σ in front of
// the quantizer): each step is multiplied by mean|new|/mean|old| over the weights it quantizes, so
// it keeps its place relative to its weights (exactly |γ/σ| where a step covers one output channel;
// a grouped conv_transpose2d's step covers one per group, and gets their mean; what the paper's
// 2·mean|w|/√Q_P would give anew for a step per tensor). A slice that is all zeros before or after
// (a γ of 0) keeps its step, so the step is still in place if the slice comes back.
void rescale_weight_step(Node& n, const at::Tensor& old_w, const at::Tensor& new_w) {
  at::Tensor* step = n.params.find("weight_step");
  if (!step || !step->defined()) node_fail(n, "LSQ weights need a learned parameter 'weight_step'");
  at::NoGradGuard no_grad;
  const bool per_channel = step->numel() > 1 || node_granularity(n) == Granularity::kPerChannel;
  const int64_t axis = n.attr_int("weight_axis");
  const at::Tensor before = abs_means(old_w, per_channel, axis), after = abs_means(new_w, per_channel, axis);
  if (before.numel() != step->numel())
    node_fail(n, "weight_step has " + std::to_string(step->numel()) + " elements for " + std::to_string(before.numel()) +
                     " weight slices");
  const at::Tensor ratio = at::where((before > 0) & (after > 0), after / before.clamp_min(1e-30), at::ones_like(before));
  step->mul_(ratio.to(step->device(), step->scalar_type()).view_as(*step)).clamp_min_(lsq_step_floor(step->scalar_type()));
}

class LsqMethod final : public MethodWithOptions<LsqOptions> {
 public:
  LsqMethod(std::string name, std::string activation_quantizer, std::string description, std::string label)
      : name_(std::move(name)),
        activation_quantizer_(std::move(activation_quantizer)),
        description_(std::move(description)),
        label_(std::move(label)) {}
  std::string name() const override { return name_; }
  std::string description() const override { return description_; }
  std::string weight_bits_text() const override { return "2..8 or 32"; }
  std::string activation_bits_text() const override { return "1..8 or 32"; }

  Config resolve(const Config& in) const override {
    Config c = in;
    if (c.weight_bits == 0) c.weight_bits = 4;
    if (c.activation_bits == 0) c.activation_bits = 4;
    if (!lsq_weight_bits(c.weight_bits)) bad_bits(name(), "weight_bits", c.weight_bits, weight_bits_text());
    if (!dorefa_bits(c.activation_bits)) bad_bits(name(), "activation_bits", c.activation_bits, activation_bits_text());
    const LsqOptions o = options(c);  // checks the keys
    if (o.step_init != "paper" && !calibrators().contains(o.step_init)) {
      std::string known = "paper";
      for (const auto& k : calibrators().names()) known += ", " + k;
      throw Error("quantize: method '" + name() + "', key 'step_init': unknown '" + o.step_init + "' (" + known + ")",
                  ErrorKind::kUsage);
    }
    if (o.percentile && o.step_init != "percentile")
      throw Error("quantize: method '" + name() + "', key 'percentile': read only with step_init: percentile (step_init is " +
                      o.step_init + ")",
                  ErrorKind::kUsage);
    if (o.step_init == "paper" && o.init_batches != 1)
      throw Error("quantize: method '" + name() + "', key 'init_batches': " + std::to_string(o.init_batches) +
                      " batches need step_init to name a calibrator (the paper's rule reads the first batch)",
                  ErrorKind::kUsage);
    return c;
  }
  std::optional<Calibration> calibration(const Config& c) const override { return calibration_of(options(c)); }
  std::string weight_quantizer(const Config& c) const override { return c.weight_bits == 32 ? "" : "lsq"; }
  void attach_weight(Node& n, const Config& c) const override {
    n.attrs["weight_bits"] = c.weight_bits;
    n.attrs["weight_axis"] = weight_output_axis(n).value_or(0);
    n.attrs["granularity"] = options(c).granularity.value_or("per_tensor");
    // The initial step from the weight itself: the paper's 2·mean|w|/√Q_P, or the calibrator's.
    const bool per_channel = node_granularity(n) == Granularity::kPerChannel;
    const at::Tensor& w = n.params.at("weight");
    const int64_t axis = n.attr_int("weight_axis");
    const std::optional<Calibration> cal = calibration(c);
    const at::Tensor step = cal ? calibrated_weight_step(n, w, c.weight_bits, *cal, per_channel, axis)
                                : lsq_initial_step(w, lsq_signed_grid(c.weight_bits), per_channel, axis);
    n.params.set("weight_step", step.to(w.device()).set_requires_grad(true));
  }
  std::optional<ActivationPlan> activations(const Config& c) const override {
    if (c.activation_bits == 32) return std::nullopt;
    ActivationPlan p;
    p.quantizer = activation_quantizer_;
    p.attrs["activation_bits"] = c.activation_bits;
    return p;
  }
  bool changes_bits() const override { return true; }
  // Each grid keeps its range s·Q_P: the step is multiplied by Q_P(old)/Q_P(new). With a calibrator
  // (step_init), the weight steps start from it again instead, on the weights as trained so far and
  // for the new grid (at fewer bits the MSE-best step clips more than the range-keeping one); the
  // activation steps are carried here and calibrated again by the caller over the stage's first
  // batches (quantize::input_quantizers).
  void change_bits(Graph& graph, const std::vector<std::string>& layers, const Config& c) const override {
    if (c.weight_bits == 32 || c.activation_bits == 32)
      throw Error("quantize: " + name() + " cannot return quantized layers to 32 bits (weight_bits " +
                      std::to_string(c.weight_bits) + ", activation_bits " + std::to_string(c.activation_bits) + ")",
                  ErrorKind::kUsage);
    at::NoGradGuard no_grad;
    const std::optional<Calibration> cal = calibration(c);
    std::set<std::string> inputs_done;
    for (const auto& name : layers) {
      Node& n = graph.node(name);
      const int64_t old_bits = n.attr_int("weight_bits");
      const at::Tensor& step = n.params.at("weight_step");
      if (cal) {
        const bool per_channel = node_granularity(n) == Granularity::kPerChannel;
        // The weight as the quantizer reads it (after a mask, and QAT folding's W·γ/σ).
        const int64_t q = find_transform_kind(n, TransformKind::kQuantizer);
        const at::Tensor w = transformed_weight(n, false, q >= 0 ? static_cast<size_t>(q) : n.weight_transforms.size());
        const at::Tensor fresh = calibrated_weight_step(n, w, c.weight_bits, *cal, per_channel,
                                                        n.attr_int("weight_axis"));
        step.copy_(fresh.to(step.device(), step.scalar_type()).view_as(step));
      } else {
        step.mul_(static_cast<double>(lsq_signed_grid(old_bits).q_p) / static_cast<double>(lsq_signed_grid(c.weight_bits).q_p));
      }
      n.attrs["weight_bits"] = c.weight_bits;
      // The act_quant feeding it, when it is this method's.
      const std::string& producer = graph.value(n.inputs.at(0)).producer;
      if (producer.empty() || !inputs_done.insert(producer).second) continue;
      Node& a = graph.node(producer);
      if (a.op != "act_quant" || a.attr_str("method") != activation_quantizer_) continue;
      const int64_t old_act = a.attr_int("activation_bits");
      lsq_act_step(a).mul_(static_cast<double>(lsq_unsigned_grid(old_act).q_p) /
                           static_cast<double>(lsq_unsigned_grid(c.activation_bits).q_p));
      a.attrs["activation_bits"] = c.activation_bits;
    }
  }
  // A step driven to or below the floor by the optimizer comes back to the floor (a clamp of every
  // step, without reading it back: no device synchronization). Returns the steps clamped.
  int64_t after_step(Graph& graph, const Config&) const override {
    at::NoGradGuard no_grad;
    int64_t clamped = 0;
    for (Node& n : graph.nodes()) {
      for (const char* name : {"weight_step", "act_step"}) {  // the parameters named by both quantizers
        const at::Tensor* s = n.params.find(name);
        if (!s || !s->defined()) continue;
        s->clamp_min_(lsq_step_floor(s->scalar_type()));
        ++clamped;
      }
    }
    return clamped;
  }
  std::string label(const Config& c) const override {
    return label_ + " W" + std::to_string(c.weight_bits) + "A" + std::to_string(c.activation_bits);
  }

 protected:
  const OptionsSchema<LsqOptions>& schema() const override { return lsq_schema(); }

 private:
  std::string name_, activation_quantizer_, description_, label_;
};

}  // namespace

const at::Tensor& lsq_act_step(const Node& n) {
  const at::Tensor* s = n.params.find("act_step");
  if (!s || !s->defined() || s->numel() != 1)
    node_fail(n, "LSQ activations need a learned parameter 'act_step' of one element");
  return *s;
}

double lsq_act_step_value(const Node& n) {
  const at::Tensor& s = lsq_act_step(n);
  return std::max(s.detach().to(at::kCPU, at::kFloat).item<double>(), lsq_step_floor(at::kFloat));
}

std::unique_ptr<QuantizerMethod> make_lsq_method(std::string name, std::string activation_quantizer,
                                                 std::string description, std::string label) {
  return std::make_unique<LsqMethod>(std::move(name), std::move(activation_quantizer), std::move(description),
                                     std::move(label));
}

void register_lsq() {
  WeightQuantizer w;
  w.name = "lsq";
  w.description = "LSQ weights (Esser et al. 2020): s·round(clamp(w/s, −2^(k−1), 2^(k−1) − 1)), learned step s";
  w.attributes = weight_quantizer_attributes(2, 8);
  w.attributes.push_back(granularity_attribute(Granularity::kPerTensor));
  w.params = {"weight_step"};
  w.forward = [](const Node& n, const at::Tensor& weight, bool) {
    const at::Tensor* step = n.params.find("weight_step");
    if (!step || !step->defined()) node_fail(n, "LSQ weights need a learned parameter 'weight_step'");
    const LsqGrid grid = lsq_signed_grid(n.attr_int("weight_bits"));
    return lsq_quantize(weight, *step, grid, lsq_gradient_scale(weight_elements(n, weight), grid.q_p),
                        n.attr_int("weight_axis"));
  };
  w.encode = [](const Node& n, const at::Tensor& weight) {
    const at::Tensor* step = n.params.find("weight_step");
    if (!step || !step->defined()) node_fail(n, "LSQ weights need a learned parameter 'weight_step'");
    return lsq_encode(weight, *step, n.attr_int("weight_bits"), n.attr_int("weight_axis"));
  };
  w.input_changed = rescale_weight_step;
  // s·q with q integral in [−128, 127]: an int8 grid with the step as its scale.
  w.integer_grid = [](const EncodedWeight& e, const Shape& shape) -> std::optional<IntegerGrid> {
    if (e.encoding != Encoding::kUniform || e.bits < 2 || e.bits > 8) return std::nullopt;
    return channel_grid(e, shape);
  };
  register_weight_quantizer(std::move(w));

  ActivationQuantizer a;
  a.name = "lsq";
  a.description = "LSQ activations (Esser et al. 2020): s·round(clamp(x/s, 0, 2^k − 1)), learned step s (act_step)";
  a.placement = Placement::kAfterRelu;
  a.params = {"act_step"};
  a.attributes = {AttrSpec::needed("activation_bits", AttrType::kInt, "bits per activation (1..8)").range(1, 8),
                  AttrSpec::boolean("relu", false, "stands for a ReLU then the quantizer")};
  a.check = [](const Node&) {};
  a.forward = [](const Node& n, const at::Tensor& x, bool) {
    const LsqGrid grid = lsq_unsigned_grid(n.attr_int("activation_bits"));
    // N: the elements of one sample (the layer's features), as the paper's N_F.
    const int64_t per_sample = x.dim() > 0 && x.size(0) > 0 ? x.numel() / x.size(0) : x.numel();
    // The grid starts at 0 and its gradient is 0 at and below 0: a ReLU before it changes nothing.
    return lsq_quantize(x, lsq_act_step(n), grid, lsq_gradient_scale(per_sample, grid.q_p), 0);
  };
  a.grid = [](const Node& n) {
    ActivationGrid g;
    g.bits = n.attr_int("activation_bits");
    g.max = lsq_act_step_value(n) * static_cast<double>(lsq_unsigned_grid(g.bits).q_p);
    g.relu = n.attr_bool("relu");
    return g;
  };
  a.torchscript = [](const Node& n, const std::string& x, const TorchScriptTerms& t) -> std::string {
    const LsqGrid grid = lsq_unsigned_grid(n.attr_int("activation_bits"));
    const std::string s = "torch.clamp(" + t.tensor("act_step") + ".reshape([]), min=" + t.number(lsq_step_floor(at::kFloat)) + ")";
    return "torch.round(torch.clamp(" + x + " / " + s + ", 0.0, " + t.number(static_cast<double>(grid.q_p)) + ")) * " + s;
  };
  // Before any data: the paper's initial step for mean|x| = 0.5; initialize() sets it from a batch.
  a.attach = [](Node& n) {
    const double q_p = static_cast<double>(lsq_unsigned_grid(n.attr_int("activation_bits")).q_p);
    n.params.set("act_step", at::full({1}, 1.0 / std::sqrt(q_p), at::kFloat).set_requires_grad(true));
  };
  a.initialize = [](const Node& n, const at::Tensor& x) {
    at::NoGradGuard no_grad;
    lsq_act_step(n).copy_(lsq_initial_step(x, lsq_unsigned_grid(n.attr_int("activation_bits"))));
  };
  a.calibrate = [](const Node& n, const Histogram& h, const Calibrator& c, const CalibrationOptions& o) {
    at::NoGradGuard no_grad;
    const CalibrationGrid g{0, lsq_unsigned_grid(n.attr_int("activation_bits")).q_p, 0.0};
    lsq_act_step(n).fill_(std::max(c.step(h, g, o), lsq_step_floor(at::kFloat)));
  };
  register_activation_quantizer(std::move(a));
  register_quantizer_method(make_lsq_method(
      "lsq", "lsq",
      "learned step size quantization (Esser et al. 2020): k-bit weights and activations on uniform grids with "
      "learned steps; W4A4 by default",
      "LSQ"));
}

}  // namespace whittle::quantize
