#pragma once
// The quantization-aware training pass: attaches the quantizers of quantizers.h to a model graph.
//
// For every selected layer (a node whose op's registry entry gives its weight an output-channel
// axis: conv2d, conv_transpose2d, linear) the pass
//   - pushes the method's weight quantizer (e.g. "dorefa") onto the node's weight transform
//     stack (the GraphModule then runs the layer with the quantized weight, after any mask already
//     on the stack; see graph/op_registry.h) and sets the attributes it owns:
//     `weight_bits` (1 binary, 2 ternary, k for DoReFa), `granularity`, `weight_axis` (the
//     output-channel axis: 0, or 1 for conv_transpose2d) and, for XNOR, `xnor_detach_alpha`;
//   - quantizes the layer's input: DoReFa activations insert an `act_quant` node
//     (c·quantize_k(clip(a, 0, c)/c); attribute `activation_clip` c when it is not 1) named
//     `<layer>.act_quant` in front of it; binary activations
//     (BNN, XNOR with activation_bits 1) binarize the ReLU's input instead of its output, as in the
//     papers: a ReLU whose every use is a binarized layer (directly or through max pooling /
//     flatten / dropout) becomes the sign binarizer in place; a ReLU that also feeds something else
//     (a residual add) stays, and a binarizer `<layer>.act_quant` reading the ReLU's input (the
//     BN output) feeds the layer; without a ReLU the layer's input is binarized as it is.
//     XNOR's optional K scaling inserts `<layer>.xnor_scale` (K) and `<layer>.xnor_mul`
//     (the layer's output times K).
//   - with int8 (ActivationPlan::whole_network), also quantizes the inputs of the residual adds and
//     concatenations joining quantized layers (OpTraits::integer_inputs), one quantizer per value
//     shared by all its quantized uses, and puts a layer's input quantizer at the ReLU before max
//     pooling or flatten, so that an integer runtime runs the whole network in int8.
// The first and the last layer in graph order (the stem conv and the classifier) stay in full
// precision unless `targets` names them exactly or the method quantizes them (int8). Layers whose stack already holds a quantizer or
// packed codes are left alone (reported as skipped), so applying the pass twice changes nothing.
//
// The methods themselves (what each quantizes, how, and with which options) are registry entries,
// one file each (quantize/method.h). Ops registered by register_all(): "act_quant" (attribute
// `method` names its activation quantizer, which reads the other attributes) and, with XNOR-Net,
// "xnor_scale". Weight transforms: one per weight quantizer, and "packed" (integer codes and scales
// of a packed checkpoint, see pack_graph()).

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/options.h"
#include "graph/graph.h"
#include "graph/graph_module.h"
#include "quantize/calibrate.h"
#include "quantize/quantizers.h"

namespace whittle::quantize {

/// Registers the quantization ops and weight transforms (idempotent, thread-safe). apply() and the
/// checkpoint reader call it; call it yourself before building a GraphModule from a graph that
/// holds quantized nodes by other means.
void register_all();

/// Options of apply(): the method, its bit widths and the layers, common to every method, and the
/// method's own options (QuantizerMethod::option_keys(), e.g. dorefa's activation_clip and
/// granularity, xnor's xnor_scale_k). Defaults per method: dorefa W8A8, twn W2 (ternary) A32, bnn
/// W1A1, xnor W1A1.
struct Config {
  /// A registered quantizer method (quantize/method.h; `whittle inspect --methods`): "dorefa",
  /// "twn", "bnn", "xnor", ...
  std::string method = "dorefa";
  /// Weight bits; 0 = the method's default. dorefa: 1..8 or 32 (full precision); twn: 2; bnn,
  /// xnor: 1 (or 32 to quantize only activations).
  int64_t weight_bits = 0;
  /// Activation bits; 0 = the method's default. dorefa, twn: 1..8 or 32 (DoReFa activation
  /// quantizer); bnn, xnor: 1 (sign binarizer) or 32.
  int64_t activation_bits = 0;
  /// The method's own options by key, e.g. options["activation_clip"] = 2.0 (dorefa, twn: the
  /// clip level c of DoReFa activations c·quantize_k(clip(a, 0, c)/c), default 1),
  /// options["granularity"] = "per_channel". A key the method does not have is an error.
  Settings options;
  /// Node names, op kinds or "re:<regex>" (graph/select.h); empty: every conv2d,
  /// conv_transpose2d and linear node.
  std::vector<std::string> targets;
  /// Patterns excluded from targets.
  std::vector<std::string> ignore;
  /// The epochs a method's schedule spans (QuantizerMethod::at_epoch; the binary methods' EDE):
  /// the quantize modifier sets its start_epoch and the run's epochs. End below 0: not given.
  double schedule_start_epoch = 0.0;
  double schedule_end_epoch = -1.0;
};

/// What apply() changed.
struct Report {
  std::vector<std::string> quantized;  ///< layers given a quantized weight and/or input, in graph order
  std::vector<std::string> inserted;   ///< nodes inserted (act_quant, xnor_scale, mul)
  std::vector<std::string> replaced;   ///< ReLU nodes turned into activation quantizers (sign; DoReFa with relu = 1)
  std::vector<std::string> skipped;    ///< "<layer>: <reason>" for selected layers left alone
  /// One line per change, for logs.
  std::string summary() const;
};

/// Validates `config` and fills in the method's defaults (its QuantizerMethod::resolve). Throws
/// whittle::Error naming the key ("method", "weight_bits", "activation_bits", an option) and the
/// allowed values.
Config resolve(const Config& config);

/// The layers `config` would quantize in `graph` (`quantized`, in graph order) and those it selects
/// but leaves alone with the reason (`skipped`), without changing the graph: what apply() does
/// first. Throws like apply() for an invalid config.
Report select_layers(const Graph& graph, const Config& config);

/// Quantizes the layers of `graph` as described at the top of this file, then validates it.
/// Throws whittle::Error for an invalid config (see resolve) or an unknown target name.
Report apply(Graph& graph, const Config& config);

/// apply() on the module's graph, then module->sync(). Parameters are unchanged (the quantized
/// weight is computed from the latent float weight on every forward), but build the optimizer
/// after this call since sync() re-registers them.
Report apply(GraphModule& module, const Config& config);

/// The method's work after each optimizer step (BNN: clips the latent float weights of its layers
/// to [−1, 1] in place, without gradient tracking, Hubara et al. 2016), for a `resolved` config
/// (resolve()). Returns the number of layers changed.
int64_t after_step(Graph& graph, const Config& resolved);

/// Data-parallel training: makes every act_quant node's buffers that follow the training batches
/// (ActivationQuantizer::replica_buffers, int8's observers) the mean over the ranks, then lets the
/// quantizer derive what depends on them, so that every rank starts the next step from the same
/// observers (each forward then moves them once more towards its own batch).
/// `replica_sum` sums a tensor in place over the ranks (every rank calls this with the same graph
/// in the same state), `ranks` is their number. Returns the nodes synchronized (0: no collective
/// was called).
int64_t sync_replicas(Graph& graph, const std::function<void(at::Tensor&)>& replica_sum, int64_t ranks);

/// The method's schedule at fractional `epoch` (QuantizerMethod::at_epoch; int8 stops its
/// activation observers at freeze_observers_epoch), for a `resolved` config. Returns the nodes changed.
int64_t at_epoch(Graph& graph, const Config& resolved, double epoch);

/// The weighted layers `config` selects, in graph order: its targets and ignore (graph/select.h),
/// the first and last layers only when named or when the method quantizes them (int8), whether or
/// not they are quantized yet.
std::vector<std::string> selected_layers(const Graph& graph, const Config& config);

/// The layers `config` selects (its targets and ignore, the first and last layers only when
/// named) that its method already quantized (their weight stack ends in the method's weight
/// quantizer), in graph order: what change_bits() acts on.
std::vector<std::string> quantized_by(const Graph& graph, const Config& config);

/// Progressive bit widths: sets the layers quantized_by(graph, config) and their act_quant inputs
/// to `config`'s weight_bits and activation_bits, carrying the method's learned parameters
/// (QuantizerMethod::change_bits). Returns them in Report::quantized. Throws whittle::Error (usage)
/// when the method has no such form, or when some selected layers are quantized by it and others
/// are not (naming one of each).
Report change_bits(Graph& graph, const Config& config);
/// change_bits() on the module's graph, then module->sync().
Report change_bits(GraphModule& module, const Config& config);

/// The loss term the method adds (PACT: λ·Σα² over its clip levels), a scalar; undefined when it
/// adds none. For a `resolved` config.
at::Tensor penalty(const Graph& graph, const Config& resolved);

/// Sets the learned parameters of the activation quantizers that initialize from data (LSQ's step:
/// 2·mean|x|/√Q_P, Esser et al. 2020, of what the layer reads: after the ReLU a node stands for)
/// from one forward pass of `batch` ([N, ...] as the model's
/// input) in the module's current mode, without gradient; the module's buffers (batch-norm running
/// statistics) are restored afterwards, so only those parameters change. Call it once after
/// apply() and before the first optimizer step (the trainer does, on its first batch). `nodes`:
/// only these act_quant nodes (those one apply() made: its Report's inserted and replaced), so that
/// parameters already learned stay; empty: every one. Returns the number of act_quant nodes set.
int64_t initialize_learned(GraphModule& module, const at::Tensor& batch, const std::vector<std::string>& nodes = {});

/// Sets the learned parameters of the activation quantizers that can be calibrated (LSQ's step,
/// LSQ+'s step and offset, PACT's clip level α) with `calibration`: the inputs of `nodes` (empty: every such act_quant
/// node) are observed over `calibration.batches` forward passes of `batch(i)` (i = 0, 1, ...;
/// [N, ...] as the model's input), with those nodes passing their input through unquantized (after
/// the ReLU they stand for, relu = 1), in the module's current mode and without gradient; then
/// each node's quantizer sets its parameters from its histogram with the calibrator (a node the
/// forward did not reach keeps its values). `merge_ranks`, when given, merges each histogram with
/// the other ranks' of a data-parallel run before (merge_over_ranks), so that every rank sets the
/// same values. The module's buffers are restored afterwards. Returns the number of act_quant
/// nodes set. Throws whittle::Error (usage) for an unknown calibrator or fewer than one batch, and
/// (runtime) for a non-finite input, before any parameter changes.
int64_t calibrate_learned(GraphModule& module, const std::function<at::Tensor(int64_t)>& batch,
                          const Calibration& calibration, const std::vector<std::string>& nodes = {},
                          const std::function<void(Histogram&)>& merge_ranks = {});

/// Empirical bias correction after calibration (Nagel et al. 2019, sec. 4.2): for each of `layers`
/// with a quantized weight (a quantizer on its stack) subtracts from its bias the mean error its
/// weight quantization adds to each output channel, E[layer(x, Ŵ − W)] over `batches` forward
/// passes of `batch(i)` ([N, ...] as the model's input) in the module's current mode, x being the
/// layer's input as the quantized model computes it before any correction (one set of passes for
/// all layers); a layer without a bias gets one. No gradient. Returns
/// the layers corrected. Throws whittle::Error (usage) for fewer than one batch.
int64_t correct_bias(GraphModule& module, const std::function<at::Tensor(int64_t)>& batch, int64_t batches,
                     const std::vector<std::string>& layers);

/// The act_quant nodes of `report` (inserted or replaced by an apply()) whose activation quantizer
/// sets learned parameters from data (by its own rule or a calibrator): what initialize_learned()
/// or calibrate_learned() should be given after it.
std::vector<std::string> nodes_to_initialize(const Graph& graph, const Report& report);

/// The act_quant nodes feeding `layers` (their first input) whose activation quantizer sets learned
/// parameters from data, in the order of `layers`, each once: what a later stage of progressive bit
/// widths calibrates again when its method has a calibrator (QuantizerMethod::calibration).
std::vector<std::string> input_quantizers(const Graph& graph, const std::vector<std::string>& layers);

// ---- packed weights (used by export/checkpoint.cpp; layout in docs/checkpoint-format.md)

/// Bits a `bits`-wide code occupies when packed (pack_codes' gapless bitstream): `bits` itself,
/// clamped to 1..8. Checkpoints written before 3- and 5..7-bit codes were packed densely hold them
/// in 4- and 8-bit fields; their index entry says so (`packed_bits`) and load_checkpoint repacks them.
int64_t storage_bits(int64_t bits);

/// True when `node` runs with a quantized weight computed from a latent float weight
/// (a stack ending in a weight quantizer, quantize/method.h, with only masks before it, and a
/// float `weight`).
bool has_quantized_weight(const Node& node);

/// The integer codes and scales the node's quantizer uses in its forward pass (of the masked
/// weight when masks precede it).
/// Throws whittle::Error naming the node when it has no quantized weight.
EncodedWeight encode_node_weight(const Node& node);

/// What a node's quantized weight is, for writers that keep the quantization (the ONNX writer's
/// QuantizeLinear/DequantizeLinear form of DoReFa grids).
struct WeightQuantization {
  std::string method;  ///< the weight quantizer ("dorefa", "twn", ...; "" for old packed checkpoints)
  Encoding encoding = Encoding::kDoReFa;
  int64_t bits = 8;
  int64_t axis = 0;   ///< output-channel axis of the weight
  at::Tensor scale;   ///< the encoding's scale (decode_weight), float [1] or [C]
};
/// The quantization of the weight the node runs with, from its quantizer (has_quantized_weight)
/// or from its packed codes (a loaded checkpoint); nullopt for a float weight. Throws
/// whittle::Error naming the node like encode_node_weight for inconsistent attributes.
std::optional<WeightQuantization> weight_quantization(const Node& node);

/// A copy of `graph` (tensors shared) in which every node with a quantized weight holds packed
/// codes instead of its float weight: the `weight` parameter is removed; buffers `weight_codes`
/// (uint8 [packed_size], codes packed with pack_codes at storage_bits) and `weight_scale`
/// (float32 [1] or [C]) are added; the stack becomes ["packed"] (masks are baked into the codes
/// and their buffers dropped, the quantizer's learned parameters with them); attributes `quant_method` (the quantizer), `weight_encoding`,
/// `weight_bits`, `weight_shape`, `weight_axis` are set.
/// The packed transform decodes to bitwise the weight the original transform gives. Nodes that are
/// already packed are kept as they are (their codes are never re-quantized).
Graph pack_graph(const Graph& graph);

/// The float weight a packed node runs with (decode of its codes and scales), on the codes' device.
/// Throws whittle::Error naming the node when its buffers or attributes are missing or inconsistent.
at::Tensor decode_packed_weight(const Node& node);

}  // namespace whittle::quantize
