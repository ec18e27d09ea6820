#pragma once
// Helpers shared by the passes of fuse/ (pattern checks and tensor access). Internal.

#include <set>
#include <string>
#include <vector>

#include "fuse/fold_math.h"
#include "graph/graph.h"

namespace whittle::fuse::detail {

/// True for the ops a BN can fold into (OpTraits::folds_batchnorm: conv2d, conv_transpose2d, linear).
bool is_foldable_layer(const std::string& op);

/// The weight layout of a layer op, from the registry: output channels on weight axis 0
/// (conv2d, linear) or 1 (conv_transpose2d, transposed).
WeightLayout layout_of(const std::string& op);

/// The BN tensors of a batch_norm node; `prefix` selects prefixed names ("bn_" in the QAT op).
BatchNormParams bn_params(const Node& node, const std::string& prefix = "");

/// "" when `value` is read by `consumer` only and is not a graph output; otherwise why not.
std::string sole_use_problem(const Graph& graph, const std::string& value, const std::string& consumer);

/// "" when the node's weight (and bias) are plain floating-point tensors the pass may rewrite;
/// otherwise why not (a weight transform computes the weight, the weight is missing or integer).
std::string plain_weight_problem(const Node& layer);

/// "" when the batch_norm node `bn` reads the only output of a conv2d / conv_transpose2d / linear
/// node (and nothing else reads it), its tensors qualify (bn_tensor_problem), and a linear output is
/// 2-D; otherwise why not. Sets *layer to the layer's name. Weight checks are the caller's.
std::string layer_bn_problem(const Graph& graph, const Node& bn, std::string* layer);

/// "" when a BN node's tensors are floating point with running statistics; otherwise why not.
std::string bn_tensor_problem(const Node& bn);

/// Names of the nodes selected by targets/ignore (graph/select.h); every node when both are empty.
std::set<std::string> selection(const Graph& graph, const std::vector<std::string>& targets,
                                const std::vector<std::string>& ignore);

/// A parameter tensor built from `value` with requires_grad copied from `like` (if defined).
at::Tensor as_parameter(const at::Tensor& value, const at::Tensor& like);

}  // namespace whittle::fuse::detail
