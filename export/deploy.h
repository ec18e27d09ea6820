#pragma once
// The deploy form exporters write: what a graph computes in eval mode, with training-only
// structure resolved.

#include "graph/graph.h"

namespace whittle {

/// A copy of `graph` (tensors cloned) in deploy form: every conv_bn_qat node becomes its base
/// layer holding the folded weight and bias (fuse::finalize_qat_batchnorm; its quantizer stays on
/// the folded weight), shapes re-inferred and the graph validated. Weight transform stacks are
/// kept: writers take each layer's eval weight from transformed_weight(node, false) and its
/// quantization from quantize::weight_quantization. The result computes what the input computes
/// in eval mode. Throws whittle::Error naming the node when the graph does not validate.
Graph deploy_graph(const Graph& graph);

}  // namespace whittle
