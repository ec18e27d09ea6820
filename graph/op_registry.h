#pragma once
// The op registry: everything a pass needs to know about an op kind lives in its OpTraits entry
// (how to run it, shape inference, cost, how channels flow through it, how it is exported).
// Adding an op means registering one entry; see ops.cpp for the built-in set.

#include <ATen/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/registration.h"
#include "core/registry.h"
#include "graph/graph.h"

namespace whittle {

/// How the channel axis flows through an op; read by channel pruning. A value's channels lie on
/// one axis (its channel axis: dim 1 of an NCHW map or an [N, C] batch, the last of an [N, T, D]
/// sequence), set by the op that produced it (OpTraits::channel_axis) and carried through the ops
/// that map channels (ChannelAxes).
enum class ChannelFlow {
  kProducerConsumer,  ///< conv/linear: consumes input channels, produces its own output channels
  kPassThrough,       ///< BN, activations, pooling, dropout: output channel c is input channel c
  kElementwise,       ///< add/mul: all inputs and the output share one channel index (coupled)
  kConcat,            ///< cat on the channel axis: output channels are the inputs' at offsets
  kSplit,             ///< split on the channel axis: outputs take the input's channels at offsets
  kExpand,            ///< flatten after a C×H×W map: each channel becomes H·W consecutive features
  kOpaque,            ///< reshape/permute/shuffle/softmax...: no default channel map (an op's own channel_map may still follow it)
};

/// Name of a ChannelFlow ("producer_consumer", ...).
const char* channel_flow_name(ChannelFlow flow);

/// Runs a node: inputs in argument order, outputs in output order. `training` selects batch
/// statistics (BN) and active dropout. Works on CPU and CUDA tensors; autograd-friendly.
using ForwardFn = std::function<std::vector<at::Tensor>(const Node& node, const std::vector<at::Tensor>& inputs,
                                                        bool training)>;
/// Infers output shapes from input shapes, attributes and parameter shapes. Throws whittle::Error
/// naming the node when the shapes do not fit (e.g. conv in_channels against weight).
using ShapeFn = std::function<std::vector<Shape>(const Node& node, const std::vector<Shape>& inputs)>;
/// Multiply-accumulate count of one run at the given shapes (0 for ops without MACs).
using MacsFn = std::function<int64_t(const Node& node, const std::vector<Shape>& inputs,
                                     const std::vector<Shape>& outputs)>;
/// Which channels an axis of a node's tensor indexes (see ChannelTensor).
enum class ChannelRole {
  kOutput,   ///< the channels the op produces (conv weight axis 0, its bias)
  kInput,    ///< the channels the op consumes (conv weight axis 1)
  kChannel,  ///< a pass-through op's one channel index, shared by input and output (BN's tensors)
};

/// Name of a ChannelRole ("output", "input", "channel").
const char* channel_role_name(ChannelRole role);

/// A parameter or buffer of a node that carries channels on one axis: what quantizers use as the
/// per-channel axis, what BN folding scales, and what channel pruning slices.
struct ChannelTensor {
  std::string name;        ///< parameter or buffer name ("weight", "bias", "running_var")
  bool buffer = false;     ///< in Node::buffers rather than Node::params
  ChannelRole role = ChannelRole::kOutput;
  int64_t axis = 0;        ///< the tensor axis that indexes the channels
  /// The axis holds the channels of one group only (channels / groups entries), as the input
  /// axis 1 of a grouped conv2d weight [Cout, Cin/g, kh, kw] and the output axis 1 of a
  /// conv_transpose2d weight [Cin, Cout/g, kh, kw]. The group count is the node's `groups`.
  bool per_group = false;
};

/// The channel-carrying tensors of a node (they may depend on its attributes, as conv_bn_qat's
/// depend on its base_op). Tensors the node lacks are listed anyway; users skip them.
using ChannelTensorsFn = std::function<std::vector<ChannelTensor>(const Node& node)>;

/// Keeps only the channels `keep` (ascending, unique, in range) on one side of a node: its
/// output channels (ChannelRole::kOutput), its input channels (kInput), or, for a pass-through op,
/// its one channel index (kChannel; either side names it too). Slices every tensor that carries
/// channels of that side and updates attributes (a depthwise conv's `groups`). Throws
/// whittle::Error naming the node when the subset cannot be represented (a grouped conv keeping
/// different channels in different groups, a packed weight).
using SliceChannelsFn = std::function<void(Node& node, ChannelRole side, const std::vector<int64_t>& keep)>;

/// The axis of a tensor of shape `shape` (an input or output of `node`) that carries the channels
/// the node consumes or produces: 1 for NCHW convolutions, the last for a linear layer
/// ([N, *, features]). See OpTraits::channel_axis.
using ChannelAxisFn = std::function<int64_t(const Node& node, const Shape& shape)>;

/// The channel axis of each input and output value of a node, for channel_map(): `inputs` as the
/// values' producers set them (empty: dim 1 each), `outputs` filled by channel_map().
struct ChannelAxes {
  std::vector<int64_t> inputs;
  std::vector<int64_t> outputs;
};

/// One input channel position an output channel position is bound to (ChannelMap).
struct ChannelSource {
  int input = 0;        ///< the node's input (argument position)
  int64_t channel = 0;  ///< position on that input's channel axis
};

/// How a node that computes no channels of its own relates its outputs' channel positions (on
/// their channel axes) to its inputs': map[o][c] lists the input positions output o's channel c is bound to. Channel
/// pruning removes bound positions together: pass-through ops bind c to input c, elementwise ops to
/// c of every input that has that channel (not a broadcast one), cat to its input at the offset,
/// flatten a channel's H·W features to the channel, a reshape back to channels all of a channel's
/// features to one another. An empty list: the position depends on no input channel.
using ChannelMap = std::vector<std::vector<std::vector<ChannelSource>>>;
/// The node's ChannelMap at the given input and output shapes, with every value's channels on
/// dim 1 (an op's own map is asked only then; with channels on another axis the op is opaque);
/// nullopt when the op mixes channels in a way pruning cannot follow (softmax over channels, a
/// general reshape): the channels on both sides are then left alone.
using ChannelMapFn = std::function<std::optional<ChannelMap>(const Node& node, const std::vector<Shape>& inputs,
                                                             const std::vector<Shape>& outputs)>;
/// For a producer whose output channels are bound to its input channels (a depthwise convolution,
/// groups = in = out: output c to input c; a channel multiplier, groups = in, out = m·in: output
/// c to input c / m): for each output channel, its input channel. Empty: independent (the usual
/// producer). For such ops slice_channels on the output side also removes the bound input
/// channels (and the `groups` they form).
using ChannelTiesFn = std::function<std::vector<int64_t>(const Node& node)>;

/// The traits of one op kind.
struct OpTraits {
  std::string kind;                         ///< registry key, e.g. "conv2d"
  std::string description;                  ///< one line, for `whittle inspect --ops`
  /// The attributes its nodes may carry, each declared once with its type, default and valid
  /// values (AttrSpec): readers take defaults from here, and Graph::validate() (so every graph
  /// loaded from a file) refuses a node whose attribute is undeclared or out of range.
  std::vector<AttrSpec> attributes;
  /// Attributes that depend on the node, beside `attributes` (an act_quant node's are those of its
  /// quantizer); empty or nullptr: none.
  std::function<const std::vector<AttrSpec>*(const Node& node)> node_attributes;
  ChannelFlow channel_flow = ChannelFlow::kOpaque;
  std::vector<std::string> required_params;   ///< parameters every node of this kind has
  std::vector<std::string> optional_params;   ///< parameters it may have ("bias")
  std::vector<std::string> required_buffers;  ///< buffers every node of this kind has
  int min_inputs = 1;
  int max_inputs = 1;  ///< -1: any number (cat)
  ForwardFn forward;
  ShapeFn infer_shapes;
  MacsFn macs;  ///< empty: no MACs
  /// Which tensors carry channels on which axis; empty: none (activations, shape ops).
  ChannelTensorsFn channel_tensors;
  /// Slices the node to a channel subset; empty: slice_channel_tensors over channel_tensors.
  SliceChannelsFn slice_channels;
  /// Ops without channels of their own: output channel positions against input ones; empty: the
  /// default of channel_flow (see channel_map()).
  ChannelMapFn channel_map;
  /// Producers: output channels bound to input channels (depthwise); empty: none.
  ChannelTiesFn channel_ties;
  /// The axis of its input and output tensors that carries the channels it produces, reads, or
  /// (a pass-through op with channel tensors, as batch_norm's statistics or a layer norm's γ)
  /// indexes: linear the last, a layer norm over the last axis the last; empty: dim 1.
  ChannelAxisFn channel_axis;
  /// y = W ⊛ x + b, affine in each output channel: a batch_norm reading its only output folds
  /// into its weight and bias (conv2d, conv_transpose2d, linear).
  bool folds_batchnorm = false;
  /// An integer runtime runs the op on quantized inputs when every input is quantized (ONNX
  /// Runtime's QLinearAdd and QLinearConcat): a whole-network int8 quantizer quantizes the inputs of
  /// such a node joining quantized layers (residual adds, concatenations), so that no float tensor
  /// is left between integer kernels (add, cat).
  bool integer_inputs = false;
  /// sign(op(x)) = op(sign(x)) in eval form: monotone, channel-preserving, no arithmetic (max
  /// pooling, flatten, dropout, identity), so a binarizer may move across the op.
  bool commutes_with_sign = false;
  /// Parameters that are a normalization's affine (γ and β of y = γ·x̂ + β): batch_norm's weight
  /// and bias, conv_bn_qat's bn_weight and bn_bias. The optimizer's norm_weight_decay applies to
  /// them (training.optimizer, docs/recipes.md).
  std::vector<std::string> norm_params;
  /// The scale γ among norm_params (batch_norm's weight, conv_bn_qat's bn_weight); empty: the op
  /// has none. Network slimming's penalty (bn_sparsity) and the bn_scale pruning criterion read it.
  std::string norm_scale;
  /// The TorchScript operators (qualified, "aten::conv2d") the importer maps onto this op.
  std::vector<std::string> torchscript_ops;
  /// True when the node outputs sign(input) ∈ {−1, +1} elementwise with sign(0) = +1 (a sign
  /// binarizer, as an act_quant whose quantizer's grid is the sign): a batch norm before it folds
  /// into a per-channel threshold (fuse/bn_threshold.h). Empty: never.
  std::function<bool(const Node& node)> binarizes;
  /// For a node that binarizes: the per-channel threshold β [C] (dim 1) it compares with, when it
  /// outputs sign(input − β) (RSign): BN → threshold folding and the deploy runtime fold it into the
  /// comparison. Empty, or an undefined tensor: it compares with 0.
  std::function<at::Tensor(const Node& node)> sign_shift;
  /// Learned parameters of a node that belong to its quantizer (an activation quantizer's step or
  /// clip): they get no weight decay (ParamRole::kQuantizer). Empty: none.
  std::function<std::vector<std::string>(const Node& node)> quantizer_params;
  // How each exporter writes the op lives with the exporter (export/), and its deploy lowering with
  // the deploy runtime (deploy/), not here.
};

/// The op registry ("ops" in `whittle inspect`): the built-in ops and those the modules register.
Registry<OpTraits>& op_registry();

/// Registers (or replaces) an op kind's traits. Throws whittle::Error for an entry without a kind,
/// forward or shape inference.
void register_op(OpTraits traits);
/// The traits of `kind`; throws whittle::Error listing the known ops when unknown.
const OpTraits& op_traits(const std::string& kind);
/// Mutable access for the op's owner while it registers; throws like op_traits.
OpTraits& mutable_op_traits(const std::string& kind);
/// True when `kind` is registered.
bool has_op(const std::string& kind);
/// All registered op kinds, sorted.
std::vector<std::string> registered_ops();
/// The registered op that TorchScript operator `qualified` ("aten::relu_") maps onto, from the
/// entries' torchscript_ops (an in-place variant "aten::x_" matches "aten::x"); "" when none.
std::string op_for_torchscript(const std::string& qualified);

// ---- channel queries, answered from the registry entries (quantize, fuse and pruning use them)

/// The node's channel-carrying tensors (its op's channel_tensors; empty when it has none).
std::vector<ChannelTensor> channel_tensors(const Node& node);
/// The axis of the node's `weight` that indexes its output channels (0 for conv2d and linear, 1
/// for conv_transpose2d); nullopt when its op has no weight carrying output channels.
std::optional<int64_t> weight_output_axis(const Node& node);
/// True when the node computes its own output channels from a weight (conv2d, conv_transpose2d,
/// linear, conv_bn_qat): the layers quantizers and pruning act on.
bool is_weighted_layer(const Node& node);
/// True when a batch_norm may fold into the node's op (OpTraits::folds_batchnorm).
bool folds_batchnorm(const Node& node);
/// True when parameter `param` of the node is a normalization's affine (OpTraits::norm_params).
/// Throws whittle::Error when the node's op is not registered.
bool is_norm_param(const Node& node, const std::string& param);

/// True when the node is a sign binarizer (OpTraits::binarizes). Throws whittle::Error when its op
/// is not registered.
bool is_sign_binarizer(const Node& node);

/// What a learned parameter of a node is, which decides its weight decay (training.optimizer:
/// weight_decay, norm_weight_decay, bias_weight_decay; quantizer parameters get none).
enum class ParamRole {
  kWeight,     ///< a layer's weight and any other parameter
  kBias,       ///< a layer's "bias"
  kNorm,       ///< a normalization's γ or β (OpTraits::norm_params)
  kQuantizer,  ///< a quantizer's learned step, offset or clip (WeightTransform::params, OpTraits::quantizer_params)
};
/// The role of parameter `param` of `node`, from its op's entry and its transform stack. Throws
/// whittle::Error when the op or a transform is not registered.
ParamRole param_role(const Node& node, const std::string& param);
/// The name of the node's normalization scale γ (OpTraits::norm_scale), "" when its op has none.
/// Throws whittle::Error when the node's op is not registered.
const std::string& norm_scale_param(const Node& node);
/// Slices the node to the channels `keep` on `side` through its op's slice hook (see
/// SliceChannelsFn for the rules and errors); the caller re-runs shape inference.
void slice_channels(Node& node, ChannelRole side, const std::vector<int64_t>& keep);
/// The node's ChannelMap (see ChannelMapFn) at its input and output shapes, positions on each
/// value's channel axis: its op's channel_map (when every axis is dim 1), or the default of its
/// channel_flow: pass-through (c ↔ input 0's c; for an op with channel tensors only when its
/// channel_axis is the input's channel axis), elementwise (c ↔ c of every input of the
/// output's rank with its channel count), concat and split on the channel axis (offsets; on
/// another dim, c ↔ c of every input/output), expand (flatten from dim s ≤ the channel axis a:
/// feature f ↔ channel ⌊f / (size of the dims after a)⌋ mod C, the features on dim s; from a later
/// dim: c ↔ c); nullopt for opaque ops and producers. `axes` (optional) gives the inputs' channel
/// axes (empty: dim 1) and receives the outputs'.
std::optional<ChannelMap> channel_map(const Node& node, const std::vector<Shape>& inputs,
                                      const std::vector<Shape>& outputs, ChannelAxes* axes = nullptr);
/// The producer's output→input channel ties (ChannelTiesFn); empty when it has none.
std::vector<int64_t> channel_ties(const Node& node);
/// The axis of `shape` (an input or output of `node`, a producer or an op with channel tensors)
/// that carries its channels: its op's channel_axis, or dim 1. Throws whittle::Error naming the node when the axis is not one of
/// the shape's.
int64_t channel_axis(const Node& node, const Shape& shape);
/// The groups a producer's channels are divided into (a grouped convolution's `groups`); 1 for an
/// op whose nodes have no groups (a linear layer). Throws whittle::Error when its op is not
/// registered.
int64_t channel_groups(const Node& node);
/// The generic slicer: index_select on every channel tensor of `side` (kChannel tensors on any
/// side), mapping global channel indices to per-group ones where ChannelTensor::per_group (then
/// every group must keep the same channels). Throws whittle::Error naming the node and tensor.
void slice_channel_tensors(Node& node, ChannelRole side, const std::vector<int64_t>& keep);
/// Replaces `tensor` by its entries `index` along `axis` (a new contiguous tensor on the same
/// device, with the same requires_grad): the one tensor operation of every slicer.
void select_channels(at::Tensor& tensor, int64_t axis, const std::vector<int64_t>& index);

/// What a weight transform does, which decides how it stacks with others.
enum class TransformKind {
  kMask,       ///< zeroes entries (pruning masks): commutes with per-output-channel scaling
  kFold,       ///< folds another op into the weight (QAT BN folding)
  kQuantizer,  ///< maps the latent float weight to its quantized values (DoReFa, TWN, BNN, XNOR)
  kDecode,     ///< computes the weight from stored codes, ignoring its input (packed checkpoints)
};

/// A weight transform: one stage of a node's transform stack (Node::weight_transforms). It maps
/// the weight computed so far (for the first stage: the node's `weight` parameter, undefined when
/// the node has none) to the weight the next stage sees, from the node's own tensors and
/// attributes: a pruning mask, QAT BN folding, a quantizer with a straight-through gradient, the
/// decoding of packed integer codes. GraphModule runs the stack on every forward and passes the
/// result to the op as its `weight`. Registered by the modules that implement them (graph/ has
/// "mask"; quantize/ and fuse/ add theirs), so graph/ depends on none of them.
struct WeightTransform {
  std::string name;
  std::string description;
  TransformKind kind = TransformKind::kQuantizer;
  /// Node attributes the transform owns (declared as an op's are; removed with it).
  std::vector<AttrSpec> attributes;
  /// Attributes it allows that depend on the node (packed codes keep the attributes of the
  /// quantizer that wrote them); empty or nullptr: none.
  std::function<const std::vector<AttrSpec>*(const Node& node)> node_attributes;
  std::vector<std::string> buffers;     ///< node buffers it owns ("weight_mask")
  /// Returns the weight after this stage (the shape the op expects, differentiable where it makes
  /// sense). `weight` is the previous stage's output; `training` is the module's mode. Throws
  /// whittle::Error naming the node when its tensors or attributes are missing or wrong.
  std::function<at::Tensor(const Node& node, const at::Tensor& weight, bool training)> apply;
  /// Learned parameters it owns (a quantizer's step size): trained with the weight, without weight
  /// decay (ParamRole::kQuantizer), removed with it.
  std::vector<std::string> params;
  /// Called (without autograd) when a stage inserted before this one in a node's stack changes the
  /// weight this stage reads from `old_input` to `new_input` (same shape; QAT BN folding's W·γ/σ):
  /// adapts the learned state that was set from the old weight (LSQ's steps) to the new one. Empty:
  /// nothing to adapt (a transform that derives everything from its input on every forward).
  std::function<void(Node& node, const at::Tensor& old_input, const at::Tensor& new_input)> input_changed;
};

/// The weight transform registry ("transforms" in `whittle inspect`).
Registry<WeightTransform>& weight_transforms();
/// Registers (or replaces) a weight transform.
void register_weight_transform(WeightTransform transform);
/// The transform `name`; throws whittle::Error listing the known ones when unknown (a checkpoint
/// naming a transform this build lacks fails here, at load time).
const WeightTransform& weight_transform(const std::string& name);
/// Names of the registered transforms, sorted.
std::vector<std::string> registered_weight_transforms();

/// The weight the node's op runs with: its `weight` parameter passed through the first `stages`
/// entries of its transform stack (all of them by default; 0 gives the parameter itself).
/// Throws whittle::Error naming the node for an unknown transform or a failing stage.
at::Tensor transformed_weight(const Node& node, bool training, size_t stages = static_cast<size_t>(-1));
/// True when the node's stack has an entry `name`.
bool has_weight_transform(const Node& node, const std::string& name);
/// Position of the first entry of `kind` in the node's stack, or -1.
int64_t find_transform_kind(const Node& node, TransformKind kind);
/// Appends `name` to the node's stack (before position `at` when given). Throws whittle::Error
/// for an unknown transform or one the stack already holds.
void push_weight_transform(Node& node, const std::string& name, int64_t at = -1);
/// Removes entry `name` from the node's stack, with the attributes, buffers and parameters it owns; returns
/// false when the stack has no such entry.
bool erase_weight_transform(Node& node, const std::string& name);
/// "" when every transform in the node's stack commutes with scaling each output channel of the
/// weight (masks only), so BN folding may scale the latent weight under it; otherwise why not.
std::string transform_stack_problem(const Node& node);

/// A node whose weight a transform computes from other tensors (the "packed" transform decodes
/// integer codes) has no `weight` parameter and records the weight's shape in the ints attribute
/// `weight_shape`. For shape inference and cost, this returns a copy of such a node holding a
/// placeholder weight of that shape (meta device, no data); nullopt for any other node.
std::optional<Node> with_placeholder_weight(const Node& node);

/// Registers the transform "mask": weight ⊙ the node's buffer `weight_mask` (same shape, 0/1),
/// the form a pruning mask takes before channels are removed. Called with the built-in ops.
void register_mask_transform();

// ---- attributes

/// Attributes any node may carry beside its op's: bookkeeping a pass records on the nodes it
/// changes (pruning's unpruned_channels). Registered by the module that writes them.
Registry<AttrSpec>& node_annotations();
/// Registers (or replaces) a node annotation. Throws whittle::Error for one without a name.
void register_node_annotation(AttrSpec spec);

/// The declaration of attribute `key` on `node`: its op's (OpTraits::attributes, then
/// node_attributes), a weight transform's in its stack, or a node annotation; nullptr when none
/// declares it. Throws whittle::Error when the node's op is not registered.
const AttrSpec* attr_spec(const Node& node, const std::string& key);
/// Every attribute declaration that applies to `node`, in attr_spec()'s order of precedence.
std::vector<const AttrSpec*> attr_specs(const Node& node);
/// Checks the node's attributes against their declarations (type, range, choices, each spec's
/// check; required ones present) and its weight transform stack (registered names, none twice).
/// Throws whittle::Error (ErrorKind::kRuntime) naming the node and the attribute or transform.
void check_attributes(const Node& node);

/// Cost of one node at the graph's declared shapes.
struct NodeCost {
  int64_t params = 0;  ///< number of parameter elements (buffers excluded)
  int64_t macs = 0;    ///< multiply-accumulates of one run at the declared input shapes
};
/// The node's cost (parameters and MACs) from its registry entry and the graph's value shapes.
NodeCost node_cost(const Graph& graph, const Node& node);
/// Totals over the graph.
NodeCost graph_cost(const Graph& graph);

}  // namespace whittle
