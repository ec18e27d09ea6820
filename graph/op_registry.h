#pragma once
// The op registry: everything a pass needs to know about an op kind lives in its OpTraits entry
// (how to run it, shape inference, cost, how channels flow through it, how it is exported).
// Adding an op means registering one entry; see ops.cpp for the built-in set.

#include <ATen/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace whittle {

/// How the channel dimension (dim 1) flows through an op; read by channel pruning.
enum class ChannelFlow {
  kProducerConsumer,  ///< conv/linear: consumes input channels, produces its own output channels
  kPassThrough,       ///< BN, activations, pooling, dropout: output channel c is input channel c
  kElementwise,       ///< add/mul: all inputs and the output share one channel index (coupled)
  kConcat,            ///< cat on dim 1: output channels are the inputs' at offsets
  kSplit,             ///< split on dim 1: outputs take the input's channels at offsets
  kExpand,            ///< flatten after a C×H×W map: each channel becomes H·W consecutive features
  kOpaque,            ///< reshape/permute/shuffle/softmax...: channels are not tracked through it
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
/// Export hooks, filled by export/ (ONNX and TorchScript writers). Opaque context pointers keep
/// graph/ free of exporter types.
using ExportFn = std::function<void(const Node& node, void* writer_context)>;

/// The traits of one op kind.
struct OpTraits {
  std::string kind;                         ///< registry key, e.g. "conv2d"
  std::string description;                  ///< one line, for `whittle inspect --ops`
  ChannelFlow channel_flow = ChannelFlow::kOpaque;
  std::vector<std::string> required_params;   ///< parameters every node of this kind has
  std::vector<std::string> optional_params;   ///< parameters it may have ("bias")
  std::vector<std::string> required_buffers;  ///< buffers every node of this kind has
  int min_inputs = 1;
  int max_inputs = 1;  ///< -1: any number (cat)
  ForwardFn forward;
  ShapeFn infer_shapes;
  MacsFn macs;  ///< empty: no MACs
  ExportFn to_onnx;         ///< set by the ONNX writer; empty until then
  ExportFn to_torchscript;  ///< set by the TorchScript writer; empty until then
};

/// Registers (or replaces) an op kind's traits.
void register_op(OpTraits traits);
/// The traits of `kind`; throws whittle::Error listing the known ops when unknown.
const OpTraits& op_traits(const std::string& kind);
/// Mutable access, for writers that attach their export hooks; throws like op_traits.
OpTraits& mutable_op_traits(const std::string& kind);
/// True when `kind` is registered.
bool has_op(const std::string& kind);
/// All registered op kinds, sorted.
std::vector<std::string> registered_ops();

/// A weight transform: computes the weight a node runs with from the node's own tensors and
/// attributes (e.g. a quantizer with a straight-through gradient applied to the latent float
/// weight, or the decoding of packed integer codes). A node opts in with the string attribute
/// `weight_transform` = the transform's name; GraphModule then calls `apply` on every forward and
/// passes the result to the op as its `weight`. Registered by the modules that implement them
/// (quantize/), so graph/ does not depend on them.
struct WeightTransform {
  std::string name;
  std::string description;
  /// Returns the effective weight (same shape as the op expects, differentiable where it makes
  /// sense). `training` is the module's mode.
  std::function<at::Tensor(const Node& node, bool training)> apply;
};

/// Registers (or replaces) a weight transform.
void register_weight_transform(WeightTransform transform);
/// The transform `name`; throws whittle::Error listing the known ones when unknown (a checkpoint
/// naming a transform this build lacks fails here, at load time).
const WeightTransform& weight_transform(const std::string& name);

/// A node whose weight a transform computes from other tensors (the "packed" transform decodes
/// integer codes) has no `weight` parameter and records the weight's shape in the ints attribute
/// `weight_shape`. For shape inference and cost, this returns a copy of such a node holding a
/// placeholder weight of that shape (meta device, no data); nullopt for any other node.
std::optional<Node> with_placeholder_weight(const Node& node);

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
