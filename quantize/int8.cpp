// Affine int8 quantization (Jacob et al., 2018, arXiv:1712.05877) as integer runtimes execute it
// (ONNX QuantizeLinear/DequantizeLinear, ONNX Runtime, TensorRT): the weight quantizer "int8", the
// activation quantizer "int8" and the method "int8" that attaches both.
//
// Weights, symmetric (zero point 0), one scale per output channel (or per tensor):
//   s = m/127 (narrow_range: codes in [−127, 127]) or m/127.5 (codes in [−128, 127], torch.ao's
//   symmetric int8: the largest weight, 127.5 steps, rounds to 128 and is clamped to 127, with no
//   gradient), m = max|w| over the channel, computed from the weights on every forward; an
//   all-zero channel gets s = 1. ŵ = clamp(round(w/s), q_min, q_max)·s, in float32.
// Activations, one scale s and integral zero point z per layer input, set by calibration
// (quantize/calibrate.h, buffers act_scale and act_zero_point, not learned):
//   x̂ = (clamp(round(x/s) + z, q_min, q_max) − z)·s, in that order (QuantizeLinear then
//   DequantizeLinear); codes uint8 [0, 255] (affine, z in [0, 255] so that 0 is on the grid) or
//   int8 [−128, 127] (symmetric, z = 0).
// Rounding is half to even (torch.round, ONNX's). Gradients are straight through where the code is
// inside [q_min, q_max] and 0 where it was clamped (torch.ao's fake quantization); scales and zero
// points get none.
// Observers (QAT, method option observe): while an act_quant node's `observe` is set and the model
// trains, each batch moves the buffers observed_min and observed_max (from the calibrated grid's
// ends) by 0.01 of the way to its own min and max (torch.ao's MovingAverageMinMaxObserver), and the
// scale and zero point become min-max's for that range; freeze_observers_epoch clears `observe`.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "graph/op_registry.h"
#include "quantize/calibrate.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "quantize/quantizers.h"

namespace whittle::quantize {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

// The smallest scale an activation grid gets (a calibrator's step can only be smaller for values
// below float32's normal range).
constexpr double kScaleFloor = 1e-12;

struct CodeRange {
  int64_t q_min, q_max;
};

CodeRange weight_codes(bool narrow_range) { return narrow_range ? CodeRange{-127, 127} : CodeRange{-128, 127}; }
CodeRange activation_codes(bool signed_codes) { return signed_codes ? CodeRange{-128, 127} : CodeRange{0, 255}; }

// clamp(round(x/s) + z, q_min, q_max) − z, times s; gradient 1 where round(x/s) + z is inside.
// `s` and `z` broadcast against x (no gradient).
struct FakeQuantFn : public torch::autograd::Function<FakeQuantFn> {
  static Variable forward(AutogradContext* ctx, const Variable& x, const at::Tensor& s, const at::Tensor& z,
                          int64_t q_min, int64_t q_max) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor code = at::round(x / s) + z;
    ctx->save_for_backward({at::logical_and(code >= static_cast<double>(q_min), code <= static_cast<double>(q_max))});
    return (at::clamp(code, static_cast<double>(q_min), static_cast<double>(q_max)) - z) * s;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const at::Tensor inside = ctx->get_saved_variables()[0];
    return {grad[0] * inside, Variable(), Variable(), Variable(), Variable()};
  }
};

// `v` [C] shaped to broadcast along `axis` of a tensor of `dim` dimensions ([1]: a 0-dim tensor).
at::Tensor along(const at::Tensor& v, int64_t dim, int64_t axis) {
  if (v.numel() == 1) return v.reshape({});
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[static_cast<size_t>(axis)] = v.numel();
  return v.reshape(shape);
}

bool narrow_range_of(const Node& n) { return n.attr_bool("narrow_range"); }

// The weight's scales, float32 [C] along the node's weight_axis (per channel) or [1], on w's device.
at::Tensor weight_scale(const Node& n, const at::Tensor& w) {
  at::NoGradGuard no_grad;
  const bool per_channel = node_granularity(n) == Granularity::kPerChannel;
  const int64_t axis = n.attr_int("weight_axis");
  const at::Tensor a = w.detach().abs().to(at::kFloat);
  at::Tensor m;
  if (!per_channel || a.dim() == 0) {
    m = a.numel() == 0 ? at::zeros({1}, a.options()) : a.max().reshape({1});
  } else {
    if (axis < 0 || axis >= a.dim()) node_fail(n, "int8 weights: weight_axis " + std::to_string(axis) + " outside a weight of shape " + shape_str(a.sizes().vec()));
    m = a.size(axis) == 0 || a.numel() == 0 ? at::zeros({a.size(axis)}, a.options())
                                           : std::get<0>(a.movedim(axis, 0).reshape({a.size(axis), -1}).max(1));
  }
  const double levels = narrow_range_of(n) ? 127.0 : 127.5;
  const at::Tensor scale = m / levels;
  return at::where(scale > 0, scale, at::ones_like(scale));  // an all-zero (or subnormal) channel: 1
}

const at::Tensor& buffer_of(const Node& n, const char* name) {
  const at::Tensor* t = n.buffers.find(name);
  if (!t || !t->defined() || t->numel() != 1)
    node_fail(n, std::string("int8 activations need a buffer '") + name + "' of one element (set by calibration)");
  return *t;
}

// The uint8 zero point of the range [lo, hi] (lo ≤ 0 ≤ hi): z = round(−lo·255/(hi − lo)) in
// [0, 255], 0 when nothing is negative.
int64_t zero_point_for(double lo, double hi) {
  if (!(lo < 0.0) || !(hi > lo)) return 0;
  return std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(-lo / ((hi - lo) / 255.0))), 0, 255);
}

// The grid calibrators work on: int8 [−128, 127] around 0, or uint8 around the zero point z.
CalibrationGrid grid_for(bool signed_codes, int64_t z) {
  return signed_codes ? CalibrationGrid{128, 127, 0.0} : CalibrationGrid{z, 255 - z, 0.0};
}

// Sets the node's scale (at least the floor, rounded to float32) and zero point.
void set_scale(const Node& n, double s, int64_t z);

// The scale and zero point of an int8 act_quant node, as doubles.
std::pair<double, int64_t> activation_scale(const Node& n) {
  const double s = buffer_of(n, "act_scale").detach().to(at::kCPU, at::kFloat).item<double>();
  const double z = buffer_of(n, "act_zero_point").detach().to(at::kCPU, at::kFloat).item<double>();
  return {s, static_cast<int64_t>(z)};
}

// The scale and zero point a node holds are valid (checked with every graph, so on load). A node
// the quantize pass has just made has neither until attach() gives it both.
void set_scale(const Node& n, double s, int64_t z) {
  buffer_of(n, "act_scale").fill_(static_cast<double>(static_cast<float>(std::max(s, kScaleFloor))));
  buffer_of(n, "act_zero_point").fill_(static_cast<double>(z));
}

// The scale and zero point of the observed range [observed_min, observed_max] (0 included).
void scale_from_observers(const Node& n) {
  const double m_lo = buffer_of(n, "observed_min").item<double>(), m_hi = buffer_of(n, "observed_max").item<double>();
  const double r_lo = std::min(m_lo, 0.0), r_hi = std::max(m_hi, 0.0);
  const bool signed_codes = n.attr_bool("signed_codes");
  const int64_t z = signed_codes ? 0 : zero_point_for(r_lo, r_hi);
  set_scale(n, step_for_range(grid_for(signed_codes, z), r_lo, r_hi), z);
}

// One observer update from a training batch `x` (see the top of this file).
void observe_batch(const Node& n, const at::Tensor& x) {
  at::NoGradGuard no_grad;
  if (x.numel() == 0) return;
  const auto [lo_t, hi_t] = at::aminmax(x.detach());
  const double lo = lo_t.item<double>(), hi = hi_t.item<double>();
  if (!std::isfinite(lo) || !std::isfinite(hi))
    node_fail(n, "int8 observer: a NaN or infinite activation in training (the scale would follow it)");
  const at::Tensor& mn = buffer_of(n, "observed_min");
  const at::Tensor& mx = buffer_of(n, "observed_max");
  const double m_lo = mn.item<double>() + Histogram::kMovingAverage * (lo - mn.item<double>());
  const double m_hi = mx.item<double>() + Histogram::kMovingAverage * (hi - mx.item<double>());
  mn.fill_(m_lo);
  mx.fill_(m_hi);
  scale_from_observers(n);
}

void check_activation(const Node& n) {
  if (!n.buffers.find("act_scale") && !n.buffers.find("act_zero_point")) return;
  const auto [s, z] = activation_scale(n);
  const CodeRange r = activation_codes(n.attr_bool("signed_codes"));
  if (!(s > 0.0) || !std::isfinite(s)) node_fail(n, "int8 activations: act_scale " + std::to_string(s) + " is not a finite value > 0");
  const double z_value = buffer_of(n, "act_zero_point").detach().to(at::kCPU, at::kDouble).item<double>();
  if (z_value != std::nearbyint(z_value) || z < r.q_min || z > r.q_max)
    node_fail(n, "int8 activations: act_zero_point " + std::to_string(z_value) + " is not an integer in [" +
                     std::to_string(r.q_min) + ", " + std::to_string(r.q_max) + "]");
  if (n.attr_bool("signed_codes") && z != 0) node_fail(n, "int8 activations: signed codes are symmetric (act_zero_point 0)");
}

// The int8 options a recipe or Config may give.
struct Int8Options {
  /// Weights: one scale per output channel (the default, as runtimes take them) or per tensor.
  std::string granularity = "per_channel";
  /// Weight codes in [−127, 127] (symmetric, TensorRT's) rather than [−128, 127].
  bool narrow_range = true;
  /// Activation codes: uint8 (affine: a zero point from the data) or int8 (symmetric).
  std::string activation_dtype = "uint8";
  /// The calibrator that sets each activation scale (whittle inspect --calibrators).
  std::string calibrator = "minmax";
  /// Training batches the activation statistics come from.
  int64_t calibration_batches = 8;
  /// The percentile calibrator's share of the values, in percent (unset: 99.99; only with it).
  std::optional<double> percentile;
  /// The first and last layers are quantized too, as int8 runtimes and their calibrators do.
  bool first_and_last = true;
  /// The whole network in int8 for integer runtimes (ActivationPlan::whole_network): residual adds
  /// and concatenations between quantized layers get quantized inputs too (QLinearAdd rather than
  /// float in between), and a layer's input quantizer sits at the ReLU before max pooling.
  bool whole_network = true;
  /// QAT: the activation scales follow moving-average min-max observers while training.
  bool observe = false;
  /// QAT: the fractional epoch from which the observers stop (−1: never).
  double freeze_observers_epoch = -1.0;
};

const OptionsSchema<Int8Options>& int8_schema() {
  using O = Int8Options;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .add("granularity", &O::granularity, "weight scales per output channel or per tensor",
               {"per_tensor", "per_channel"})
          .add("narrow_range", &O::narrow_range, "weight codes in [−127, 127] rather than [−128, 127]")
          .add("activation_dtype", &O::activation_dtype,
               "activation codes: uint8 (affine, zero point from the data) or int8 (symmetric)", {"uint8", "int8"})
          .add("calibrator", &O::calibrator,
               "the calibrator of the activation scales (whittle inspect --calibrators: minmax, moving_minmax, "
               "percentile, entropy, mse)")
          .add("calibration_batches", &O::calibration_batches, "batches the activation statistics come from")
          .in_range(Range::closed(1, 100000))
          .add("percentile", &O::percentile, "calibrator percentile: the share of the values the grid covers, in percent",
               {}, "99.99")
          .in_range(Range{50, 100, false, true})  // below 50 is surely a fraction given for a percent (0.99 for 99)
          .add("first_and_last", &O::first_and_last,
               "quantize the first and last layers too, as int8 runtimes do (false: they stay in full precision "
               "unless targets names them)")
          .add("whole_network", &O::whole_network,
               "the whole network in int8 for integer runtimes: the inputs of residual adds and concatenations "
               "between quantized layers quantized too (QLinearAdd), input quantizers at the ReLU before max "
               "pooling (false: only the quantized layers' inputs)")
          .add("observe", &O::observe,
               "QAT: the activation scales follow moving averages (0.01) of each batch's min and max while training")
          .add("freeze_observers_epoch", &O::freeze_observers_epoch,
               "QAT: the fractional epoch from which the observers stop (−1: never)")
          .in_range(Range{-1, 1e9});
  return schema;
}

class Int8Method final : public MethodWithOptions<Int8Options> {
 public:
  std::string name() const override { return "int8"; }
  std::string description() const override {
    return "affine int8 (Jacob et al. 2018): symmetric per-channel weights, uint8 affine or int8 symmetric "
           "activations with calibrated scales and zero points, as ONNX Runtime and TensorRT execute them";
  }
  std::string weight_bits_text() const override { return "8 or 32"; }
  std::string activation_bits_text() const override { return "8 or 32"; }

  Config resolve(const Config& in) const override {
    Config c = in;
    if (c.weight_bits == 0) c.weight_bits = 8;
    if (c.activation_bits == 0) c.activation_bits = 8;
    if (c.weight_bits != 8 && c.weight_bits != 32) bad_bits(name(), "weight_bits", c.weight_bits, weight_bits_text());
    if (c.activation_bits != 8 && c.activation_bits != 32)
      bad_bits(name(), "activation_bits", c.activation_bits, activation_bits_text());
    const Int8Options o = options(c);
    auto refuse = [&](const std::string& key, const std::string& why) {
      throw Error("quantize: method 'int8', key '" + key + "': " + why, ErrorKind::kUsage);
    };
    if (!calibrators().contains(o.calibrator)) {
      std::string known;
      for (const auto& k : calibrators().names()) known += (known.empty() ? "" : ", ") + k;
      refuse("calibrator", "unknown '" + o.calibrator + "' (" + known + ")");
    }
    if (o.percentile && o.calibrator != "percentile")
      refuse("percentile", "read only with calibrator: percentile (calibrator is " + o.calibrator + ")");
    if (o.freeze_observers_epoch != -1.0 && o.freeze_observers_epoch < 0)
      refuse("freeze_observers_epoch", SettingValue(o.freeze_observers_epoch).text() + " (−1 for never, or ≥ 0)");
    if (o.freeze_observers_epoch >= 0 && !o.observe) refuse("freeze_observers_epoch", "applies with observe: true only");
    if (o.observe && c.activation_bits == 32) refuse("observe", "there are no activation quantizers (activation_bits 32)");
    return c;
  }
  std::optional<Calibration> calibration(const Config& c) const override {
    const Int8Options o = options(c);
    Calibration cal;
    cal.calibrator = o.calibrator;
    cal.batches = o.calibration_batches;
    if (o.percentile) cal.options.percentile = *o.percentile;
    return cal;
  }
  std::string weight_quantizer(const Config& c) const override { return c.weight_bits == 32 ? "" : "int8"; }
  void attach_weight(Node& n, const Config& c) const override {
    const Int8Options o = options(c);
    n.attrs["weight_bits"] = int64_t{8};
    n.attrs["weight_axis"] = weight_output_axis(n).value_or(0);
    n.attrs["granularity"] = o.granularity;
    n.attrs["narrow_range"] = o.narrow_range;
  }
  std::optional<ActivationPlan> activations(const Config& c) const override {
    if (c.activation_bits == 32) return std::nullopt;
    ActivationPlan p;
    p.quantizer = "int8";
    p.attrs["signed_codes"] = options(c).activation_dtype == "int8";
    p.attrs["observe"] = options(c).observe;
    p.whole_network = options(c).whole_network;
    return p;
  }
  bool quantizes_first_and_last(const Config& c) const override { return options(c).first_and_last; }
  // At freeze_observers_epoch every int8 observer of the graph stops.
  int64_t at_epoch(Graph& graph, const Config& c, double epoch) const override {
    const Int8Options o = options(c);
    if (!o.observe || o.freeze_observers_epoch < 0 || epoch < o.freeze_observers_epoch) return 0;
    int64_t frozen = 0;
    for (Node& n : graph.nodes()) {
      if (n.op != "act_quant" || n.attr_str("method") != "int8" || !n.attr_bool("observe")) continue;
      n.attrs["observe"] = false;
      ++frozen;
    }
    return frozen;
  }
  std::string label(const Config& c) const override {
    if (c.activation_bits == 32) return "int8 W8A32";
    return std::string("int8 W8A8") + (options(c).activation_dtype == "int8" ? " (int8 activations)" : "");
  }

 protected:
  const OptionsSchema<Int8Options>& schema() const override { return int8_schema(); }
};

}  // namespace

void register_int8() {
  WeightQuantizer w;
  w.name = "int8";
  w.description =
      "int8 weights (Jacob et al. 2018): s·clamp(round(w/s), −127, 127), s = max|w|/127 per output channel "
      "(narrow_range; else [−128, 127] with s = max|w|/127.5)";
  w.attributes = weight_quantizer_attributes(8, 8);
  w.attributes.push_back(granularity_attribute(Granularity::kPerChannel));
  w.attributes.push_back(AttrSpec::boolean("narrow_range", true, "codes in [−127, 127] rather than [−128, 127]"));
  // In float32 whatever the weight's dtype (a half-precision scale would round the codes otherwise),
  // the result in the weight's dtype.
  w.forward = [](const Node& n, const at::Tensor& weight, bool) {
    const CodeRange r = weight_codes(narrow_range_of(n));
    const at::Tensor w32 = weight.to(at::kFloat);
    const at::Tensor s = along(weight_scale(n, w32), w32.dim(), n.attr_int("weight_axis"));
    return FakeQuantFn::apply(w32, s, at::zeros({}, s.options()), r.q_min, r.q_max).to(weight.scalar_type());
  };
  // Codes c = q + 128 of the uniform encoding (value (c − 128)·s): bitwise the forward's q·s.
  w.encode = [](const Node& n, const at::Tensor& weight) {
    at::NoGradGuard no_grad;
    const CodeRange r = weight_codes(narrow_range_of(n));
    const at::Tensor w32 = weight.detach().to(at::kFloat);
    const at::Tensor scale = weight_scale(n, w32);
    const at::Tensor s = along(scale, w32.dim(), n.attr_int("weight_axis"));
    EncodedWeight e;
    e.codes = at::clamp(at::round(w32 / s), static_cast<double>(r.q_min), static_cast<double>(r.q_max)) + 128.0;
    e.scale = scale.reshape({-1}).contiguous();
    e.encoding = Encoding::kUniform;
    e.bits = 8;
    e.axis = n.attr_int("weight_axis");
    return e;
  };
  w.integer_grid = [](const EncodedWeight& e, const Shape& shape) -> std::optional<IntegerGrid> {
    if (e.encoding != Encoding::kUniform || e.bits != 8) return std::nullopt;
    return channel_grid(e, shape);
  };
  register_weight_quantizer(std::move(w));

  ActivationQuantizer a;
  a.name = "int8";
  a.description =
      "int8 activations (Jacob et al. 2018): (clamp(round(x/s) + z, q_min, q_max) − z)·s, uint8 affine or int8 "
      "symmetric, scale and zero point from calibration (act_scale, act_zero_point)";
  a.placement = Placement::kAfterRelu;
  a.buffers = {"act_scale", "act_zero_point", "observed_min", "observed_max"};
  a.attributes = {AttrSpec::boolean("signed_codes", false, "int8 codes [−128, 127] (symmetric) rather than uint8 [0, 255]"),
                  AttrSpec::boolean("relu", false, "stands for a ReLU then the quantizer"),
                  AttrSpec::boolean("observe", false, "in training, the scale follows moving-average min-max observers")};
  a.check = check_activation;
  a.forward = [](const Node& n, const at::Tensor& x_in, bool training) {
    const CodeRange r = activation_codes(n.attr_bool("signed_codes"));
    const at::Tensor x = n.attr_bool("relu") ? at::relu(x_in) : x_in;
    if (training && n.attr_bool("observe")) observe_batch(n, x);
    const at::Tensor s = buffer_of(n, "act_scale").detach().to(x.device(), x.scalar_type()).reshape({});
    const at::Tensor z = buffer_of(n, "act_zero_point").detach().to(x.device(), x.scalar_type()).reshape({});
    return FakeQuantFn::apply(x, s, z, r.q_min, r.q_max);
  };
  a.grid = [](const Node& n) {
    const auto [s, z] = activation_scale(n);
    ActivationGrid g;
    g.bits = 8;
    g.max = s * 255.0;  // exact: s is a float32
    g.affine = true;
    g.zero_point = z;
    g.signed_codes = n.attr_bool("signed_codes");
    g.relu = n.attr_bool("relu");
    return g;
  };
  a.torchscript = [](const Node& n, const std::string& x_in, const TorchScriptTerms& t) -> std::string {
    const CodeRange r = activation_codes(n.attr_bool("signed_codes"));
    const std::string x = n.attr_bool("relu") ? "torch.relu(" + x_in + ")" : x_in;
    const std::string s = t.tensor("act_scale") + ".reshape([]).to(" + x_in + ".dtype)";
    const std::string z = t.tensor("act_zero_point") + ".reshape([]).to(" + x_in + ".dtype)";
    return "(torch.clamp(torch.round(" + x + " / " + s + ") + " + z + ", " + t.number(static_cast<double>(r.q_min)) +
           ", " + t.number(static_cast<double>(r.q_max)) + ") - " + z + ") * " + s;
  };
  // Data-parallel training: the observers follow each rank's batches; their mean over the ranks
  // gives every rank the same grid after each step.
  a.replica_buffers = [](const Node& n) -> std::vector<at::Tensor> {
    if (!n.attr_bool("observe")) return {};
    return {buffer_of(n, "observed_min"), buffer_of(n, "observed_max")};
  };
  a.replicas_synced = scale_from_observers;
  // Before calibration: the grid [0, 1] (uint8) or [−1, 1) (int8), and observers at its ends.
  a.attach = [](Node& n) {
    n.buffers.set("act_scale", at::full({1}, n.attr_bool("signed_codes") ? 1.0 / 128.0 : 1.0 / 255.0, at::kFloat));
    n.buffers.set("act_zero_point", at::zeros({1}, at::kFloat));
    n.buffers.set("observed_min", at::full({1}, n.attr_bool("signed_codes") ? -1.0 : 0.0, at::kFloat));
    n.buffers.set("observed_max", at::ones({1}, at::kFloat));
  };
  // uint8: the zero point from the range [min(x, 0), max(x, 0)] (0 when nothing is negative), then
  // the calibrator's step for the grid around it; int8: z = 0 and the step for [−128, 127].
  a.calibrate = [](const Node& n, const Histogram& h, const Calibrator& c, const CalibrationOptions& o) {
    at::NoGradGuard no_grad;
    const bool signed_codes = n.attr_bool("signed_codes");
    const double lo = h.count > 0 ? std::min(h.min, 0.0) : 0.0, hi = h.count > 0 ? std::max(h.max, 0.0) : 0.0;
    const int64_t z = signed_codes ? 0 : zero_point_for(lo, hi);
    const CalibrationGrid grid = grid_for(signed_codes, z);
    set_scale(n, c.step(h, grid, o), z);
    // Observers (QAT) start from the calibrated grid's ends.
    const double s = buffer_of(n, "act_scale").item<double>();
    if (const at::Tensor* mn = n.buffers.find("observed_min")) mn->fill_(-static_cast<double>(grid.q_n) * s);
    if (const at::Tensor* mx = n.buffers.find("observed_max")) mx->fill_(static_cast<double>(grid.q_p) * s);
  };
  register_activation_quantizer(std::move(a));
  register_quantizer_method(std::make_unique<Int8Method>());
}

}  // namespace whittle::quantize
