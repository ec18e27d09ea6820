#pragma once
// The extension points of quantization (DESIGN.md, "Extension points"): three registries, each
// entry owning everything about itself, so that a new method is one file.
//
//   - A WeightQuantizer maps a layer's latent float weight to its quantized values with a
//     straight-through gradient (DoReFa, TWN, BNN, XNOR-Net weights). It owns the node attributes
//     and learned parameters it reads, its encoding in a packed checkpoint (integer codes and
//     scales, and their decoding), and, when its values are an int8 grid, that grid for the ONNX
//     writer. Registering one also registers the weight transform of the same name
//     (graph/op_registry.h), which GraphModule runs on every forward.
//   - An ActivationQuantizer is what an `act_quant` node runs, named by the node's `method`
//     attribute ("dorefa", "sign"): its forward, the attributes it reads and their checks, where it
//     goes relative to a ReLU, the grid its outputs lie on (read by the ONNX writer and the deploy
//     runtime) and its TorchScript expression.
//   - A QuantizerMethod is what a recipe's `quantize` modifier (and quantize::apply) names: its
//     options (bound to recipe keys once, OptionsSchema), their validation and defaults, the
//     weight quantizer and activation quantizer it attaches with their attributes, any further
//     rewrite (XNOR-Net's K scale), its work after each optimizer step (BNN's latent weight clip)
//     and its label in reports.
//
// The shipped methods are dorefa.cpp, twn.cpp, bnn.cpp, xnor.cpp, lsq.cpp, lsq_plus.cpp, pact.cpp and int8.cpp.
// Nothing outside an entry compares its name as a string: callers ask these registries.

#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/options.h"
#include "core/registry.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "quantize/calibrate.h"
#include "quantize/quantize.h"
#include "quantize/quantizers.h"

namespace whittle::quantize {

// ---- weight quantizers

/// A weight's values as an int8 grid: weight = scale[c]·q along `axis` (scale per output channel),
/// q integral in [−128, 127]. The ONNX writer stores such weights as their codes q, an int8
/// initializer, feeding DequantizeLinear (zero point 0): no float copy of the weight.
struct IntegerGrid {
  at::Tensor scale;  ///< float32 [C], C = weight.size(axis)
  int64_t axis = 0;
};

/// One weight quantizer (see the top of this file).
struct WeightQuantizer {
  std::string name;         ///< registry key and weight transform name, e.g. "dorefa"
  std::string description;  ///< one line, with the paper
  /// Node attributes it owns, declared with type, default and range (removed with it from a
  /// node's stack; weight_quantizer_attributes() gives the common ones).
  std::vector<AttrSpec> attributes;
  /// Learned parameters it owns on the node (e.g. a step size): they join the optimizer with no
  /// weight decay (ParamRole::kQuantizer) and are removed with it.
  std::vector<std::string> params;
  /// The quantized weight from the latent float weight `w` (the node's `weight` after any mask),
  /// with its straight-through gradient. Throws whittle::Error naming the node for bad attributes.
  std::function<at::Tensor(const Node& node, const at::Tensor& w, bool training)> forward;
  /// The integer codes and scales whose decode is bitwise the forward's value in eval mode.
  std::function<EncodedWeight(const Node& node, const at::Tensor& w)> encode;
  /// The weight of packed codes (uint8 or integral float, the weight's shape) with `scale`,
  /// as a `dtype` tensor; empty: decode_weight by the encoding the packed node records.
  std::function<at::Tensor(const Node& packed, const at::Tensor& codes, const at::Tensor& scale, at::ScalarType dtype)>
      decode;
  /// The int8 grid of an encoded weight of `shape`, when it is one; empty or nullopt: the ONNX
  /// writer stores the decoded float weight.
  std::function<std::optional<IntegerGrid>(const EncodedWeight& e, const Shape& shape)> integer_grid;
  /// Adapts learned state set from the old weight when a stage inserted before the quantizer (QAT
  /// BN folding) changes the weight it reads (WeightTransform::input_changed); empty: none to adapt.
  std::function<void(Node& node, const at::Tensor& old_input, const at::Tensor& new_input)> input_changed;
};

/// The int8 grid of the weight `node` runs with (its weight quantizer's integer_grid, for a
/// quantizer stack or packed codes); nullopt when it has none or the weight is float.
std::optional<IntegerGrid> integer_grid(const Node& node);

/// For weight quantizers whose encoded values are q·scale[c]/divisor with q integral in
/// [−128, 127] (LSQ, int8, TWN, sign codes; DoReFa with its levels as divisor): that IntegerGrid,
/// the scale (computed in double, then float32) expanded to the C = shape[e.axis] channels;
/// nullopt when e.axis is outside `shape` or the scale fits neither granularity.
std::optional<IntegerGrid> channel_grid(const EncodedWeight& e, const Shape& shape, double divisor = 1.0);

/// The weight quantizer registry ("weight quantizers" in `whittle inspect`).
Registry<WeightQuantizer>& weight_quantizers();
/// Registers `q` in weight_quantizers() and its weight transform (TransformKind::kQuantizer, the
/// same name, attributes and parameters) in the transform registry. Throws whittle::Error for an
/// entry without a name, forward or encode.
void register_weight_quantizer(WeightQuantizer q);

// ---- activation quantizers

/// Where an activation quantizer sits relative to a ReLU feeding the layer.
enum class Placement {
  /// After it (a grid on [0, max]): a ReLU whose every use is a quantized layer becomes the
  /// quantizer with attribute relu = 1; otherwise an act_quant node is inserted before the layer.
  kAfterRelu,
  /// Instead of it (a binarizer, as in the BNN and XNOR-Net papers): a ReLU whose every use is a
  /// binarized layer (directly or through sign-commuting ops) becomes the binarizer; otherwise a
  /// binarizer reads the ReLU's input.
  kBinarizeReluInput,
};

/// The values an activation quantizer's outputs lie on, for the ONNX writer (its QDQ form) and
/// the deploy runtime (which reads codes or packed signs instead of floats).
struct ActivationGrid {
  bool sign = false;  ///< outputs are −1 and +1, sign(0) = +1
  /// sign false: outputs max·a/(2^bits − 1), a integral in [0, 2^bits − 1]; bits 32: not a grid.
  int64_t bits = 32;
  double max = 1.0;
  /// The grid also stands for a ReLU before it (relu = 1): identical values below 32 bits, and a
  /// ReLU at 32 bits.
  bool relu = false;
  /// A learned offset β the grid is shifted by (LSQ+): outputs β + max·a/(2^bits − 1), computed
  /// as round(clip(x − β, 0, max)/step)·step + β. 0: none.
  double offset = 0.0;
  /// An affine grid (Jacob et al. 2018; ONNX QuantizeLinear/DequantizeLinear): outputs
  /// (a − zero_point)·step, step = max/(2^bits − 1), a = clamp(round(x/step) + zero_point, a_min,
  /// a_max), computed in that order; a in [0, 2^bits − 1], or [−2^(bits−1), 2^(bits−1) − 1] with
  /// signed_codes. affine false: the grids above (zero point 0, unsigned codes).
  bool affine = false;
  int64_t zero_point = 0;
  bool signed_codes = false;
};

/// What an activation quantizer's TorchScript form may use beside its input variable.
struct TorchScriptTerms {
  /// A TorchScript float literal of `v` (exact).
  std::function<std::string(double v)> number;
  /// A local variable bound to the node's parameter or buffer `name` (registered on the module).
  std::function<std::string(const std::string& name)> tensor;
};

/// One activation quantizer (see the top of this file).
struct ActivationQuantizer {
  std::string name;         ///< the act_quant `method` value, e.g. "dorefa"
  std::string description;  ///< one line, with the paper
  Placement placement = Placement::kAfterRelu;
  /// Learned parameters it owns on its act_quant node (no weight decay, ParamRole::kQuantizer).
  std::vector<std::string> params;
  /// Buffers it owns on its act_quant node (set from data, not learned: int8's scale and zero
  /// point); attach() creates them and the quantize pass moves them to the layers' device.
  std::vector<std::string> buffers;
  /// The attributes of its act_quant nodes beside `method`, declared with type, default and range
  /// (checked with every graph, so on load).
  std::vector<AttrSpec> attributes;
  /// Checks what the declarations cannot (attributes against one another); throws whittle::Error
  /// naming the node and attribute.
  std::function<void(const Node& node)> check;
  /// The quantized activation of `x` (any shape), with its straight-through gradient.
  std::function<at::Tensor(const Node& node, const at::Tensor& x, bool training)> forward;
  /// The grid of its outputs (see ActivationGrid).
  std::function<ActivationGrid(const Node& node)> grid;
  /// A TorchScript expression over variable `x` giving bitwise the forward's value in eval mode.
  std::function<std::string(const Node& node, const std::string& x, const TorchScriptTerms& terms)> torchscript;
  /// Creates the learned parameters (`params`) on an act_quant node the quantize pass has just made
  /// (or turned a ReLU into), with their values before any data is seen. Empty: it has none.
  std::function<void(Node& node)> attach;
  /// Sets the learned parameters from one batch's input `x` to the node (no gradient), for
  /// initialize_learned(); empty: nothing to set from data.
  std::function<void(const Node& node, const at::Tensor& x)> initialize;
  /// Sets the learned parameters from the statistics of its input over several batches with the
  /// calibrator `c` (no gradient), for calibrate_learned(); empty: it cannot be calibrated.
  std::function<void(const Node& node, const Histogram& h, const Calibrator& c, const CalibrationOptions& o)> calibrate;
  /// Its learned parameters that carry the input's channels (RSign's shift [C], axis 0), which
  /// channel pruning slices with the channels they belong to; empty: none.
  ChannelTensorsFn channel_tensors;
  /// A sign quantizer that compares its input with a per-channel threshold: sign(x − β) with β
  /// [C] on dim 1 (RSign, Liu et al. 2020); BN → threshold folding and the deploy runtime fold β
  /// into the comparison. Empty: it compares with 0.
  std::function<at::Tensor(const Node& node)> sign_shift;
  /// Data-parallel training: the buffers of the node that follow this rank's training batches
  /// (int8's observers while `observe` is set), which sync_replicas() averages over the ranks after
  /// each optimizer step; empty (or an empty list): none.
  std::function<std::vector<at::Tensor>(const Node& node)> replica_buffers;
  /// After those buffers were averaged: derives what depends on them (int8's scale and zero point).
  std::function<void(const Node& node)> replicas_synced;
};

/// The activation quantizer registry ("activation quantizers" in `whittle inspect`).
Registry<ActivationQuantizer>& activation_quantizers();
/// Registers (or replaces) an activation quantizer. Throws whittle::Error for an entry without a
/// name, check, forward, grid or torchscript form.
void register_activation_quantizer(ActivationQuantizer q);
/// The activation quantizer of an act_quant node (its `method` attribute). Throws whittle::Error
/// naming the node for an unknown one.
const ActivationQuantizer& activation_quantizer_of(const Node& act_quant);

// ---- quantizer methods

/// What the quantize pass learns from a method for one configuration.
struct ActivationPlan {
  std::string quantizer;              ///< an activation quantizer's name
  std::map<std::string, Attr> attrs;  ///< attributes of its act_quant nodes, beside `method`
  /// For integer runtimes that run the whole network in int8: also quantize the inputs of the nodes
  /// joining quantized layers whose op the registry marks integer_inputs (residual adds,
  /// concatenations), and put a layer's input quantizer at the ReLU before max pooling, flatten or
  /// dropout (OpTraits::commutes_with_sign; a monotone quantizer commutes with them exactly in
  /// eval form).
  bool whole_network = false;
};

/// What a method's finish() may need of the activation rewrite: for each quantized layer, the
/// real-valued value its binarized input was computed from ("" when unknown, e.g. pooled after a
/// ReLU).
using RealSources = std::map<std::string, std::string>;

/// A quantization method (see the top of this file). Implementations are stateless; every call
/// gets the configuration resolve() returned.
class QuantizerMethod {
 public:
  virtual ~QuantizerMethod() = default;
  /// Registry key, e.g. "dorefa".
  virtual std::string name() const = 0;
  /// One line with the paper, for `whittle inspect --methods` and docs.
  virtual std::string description() const = 0;
  /// Its own option keys (beyond method, weight_bits, activation_bits, targets and ignore), with
  /// types and defaults, for recipe validation, `whittle keys` and docs/recipes.md.
  virtual std::vector<KeySpec> option_keys() const { return {}; }
  /// Allowed widths, for messages and docs ("1..8 or 32").
  virtual std::string weight_bits_text() const = 0;
  virtual std::string activation_bits_text() const = 0;
  /// `config` with the method's defaults filled in (weight_bits, activation_bits 0 → default) and
  /// its options checked. Throws whittle::Error "quantize: <key> = <value> ..." naming the key
  /// and the allowed values.
  virtual Config resolve(const Config& config) const = 0;
  /// True when the first and the last layer in graph order are quantized like the others (int8,
  /// as runtimes and their calibrators do); false (the low-bit methods, as their papers do): they
  /// stay in full precision unless `targets` names them.
  virtual bool quantizes_first_and_last(const Config& resolved) const { return false; }
  /// The weight quantizer to push on each chosen layer's stack; "" when weights stay float.
  virtual std::string weight_quantizer(const Config& resolved) const = 0;
  /// Sets the attributes (and creates the learned parameters) the weight quantizer reads on a
  /// chosen layer whose stack now ends in it.
  virtual void attach_weight(Node& layer, const Config& resolved) const = 0;
  /// The activation quantizer and its attributes; nullopt when activations stay float.
  virtual std::optional<ActivationPlan> activations(const Config& resolved) const = 0;
  /// Rewrites after the weights and activations are attached (XNOR-Net's K scale); `layers` are
  /// the quantized layers in graph order. Default: nothing.
  virtual void finish(Graph& graph, const Config& resolved, const std::vector<std::string>& layers,
                      const RealSources& real_sources, Report& report) const {}
  /// After each optimizer step (BNN's latent weight clip to [−1, 1], LSQ's step floor); returns
  /// the nodes changed. Default: nothing.
  virtual int64_t after_step(Graph& graph, const Config& resolved) const { return 0; }
  /// The method's schedule, called by the quantize modifier before every training step with the
  /// fractional epoch (int8: its observers stop at freeze_observers_epoch); returns the nodes
  /// changed. Default: nothing.
  virtual int64_t at_epoch(Graph& graph, const Config& resolved, double epoch) const { return 0; }
  /// Whether change_bits() is supported: a later recipe entry of the method may then take over the
  /// layers of an earlier one at other bit widths (progressive bit widths). Default: no.
  virtual bool changes_bits() const { return false; }
  /// Sets the bit widths of `layers` (which this method quantized) and of the act_quant nodes
  /// feeding them to `resolved`'s, carrying their learned parameters so that each grid keeps its
  /// range (LSQ: step·Q_P stays). Default: throws whittle::Error (usage) naming the method.
  virtual void change_bits(Graph& graph, const std::vector<std::string>& layers, const Config& resolved) const;
  /// How its learned activation parameters start from data: a calibrator over a number of batches
  /// (calibrate_learned()), or nullopt for its own rule from the first batch (initialize_learned();
  /// the default).
  virtual std::optional<Calibration> calibration(const Config& resolved) const { return std::nullopt; }
  /// A term the training loss adds (PACT's L2 penalty λ·Σα² on its clip levels), a scalar on the
  /// parameters' device; undefined when the method adds none (the default).
  virtual at::Tensor penalty(const Graph& graph, const Config& resolved) const { return {}; }
  /// A short label for reports and logs ("DoReFa W2A2", "TWN", "BNN").
  virtual std::string label(const Config& resolved) const = 0;
};

/// A method whose options are the plain struct `Options`, bound to keys by schema() (the struct's
/// initializers are the defaults, written once).
template <typename Options>
class MethodWithOptions : public QuantizerMethod {
 public:
  std::vector<KeySpec> option_keys() const override { return schema().keys(); }

 protected:
  /// The keys of `Options`.
  virtual const OptionsSchema<Options>& schema() const = 0;
  /// The method's options as `config` gives them. Throws whittle::Error (usage)
  /// "quantize: method '<name>', key '<key>': ..." for a key it does not have or a bad value.
  Options options(const Config& config) const;
};

/// The method registry ("methods" in `whittle inspect`).
Registry<QuantizerMethod>& quantizer_methods();
/// Registers (or replaces) a method under its name().
void register_quantizer_method(std::unique_ptr<QuantizerMethod> method);
/// The method `name`; throws whittle::Error (usage) "quantize: unknown method ..." listing them.
const QuantizerMethod& quantizer_method(const std::string& name);

/// The shipped methods' registrations, one file each (dorefa.cpp, twn.cpp, bnn.cpp, xnor.cpp,
/// lsq.cpp, lsq_plus.cpp, pact.cpp, int8.cpp), called by register_all().
void register_dorefa();
void register_twn();
void register_bnn();
void register_xnor();
void register_lsq();
void register_lsq_plus();
void register_pact();
void register_int8();

/// For method implementations: "quantize: <key> = <value> is not supported by method '<m>'
/// (<allowed>)" as a whittle::Error (usage).
[[noreturn]] void bad_bits(const std::string& method, const std::string& key, int64_t value, const std::string& allowed);
/// For method implementations: true for 1..8 and 32 (DoReFa's widths).
inline bool dorefa_bits(int64_t k) { return (k >= 1 && k <= 8) || k == 32; }
/// "node '<name>' (<op>): <message>" as a whittle::Error.
[[noreturn]] void node_fail(const Node& node, const std::string& message);
/// A node `name` of op `op` reading `inputs`, with `attrs` (for a method's rewrites).
Node make_node(const std::string& name, const std::string& op, std::vector<std::string> inputs,
               std::map<std::string, Attr> attrs);
/// The granularity attribute of a layer (its weight quantizer declares the default).
Granularity node_granularity(const Node& node);
/// The attributes every weight quantizer owns: weight_bits (required, in [min_bits, max_bits]) and
/// weight_axis (the weight's output-channel axis, default 0).
std::vector<AttrSpec> weight_quantizer_attributes(int64_t min_bits, int64_t max_bits);
/// The `granularity` attribute ("per_tensor" | "per_channel") with the quantizer's default.
AttrSpec granularity_attribute(Granularity fallback);

template <typename Options>
Options MethodWithOptions<Options>::options(const Config& config) const {
  return schema().parse(config.options, "quantize: method '" + name() + "'");
}

}  // namespace whittle::quantize
