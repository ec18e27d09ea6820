#pragma once
// The serialized form of a Graph's structure (JSON text), which checkpoints store next to the
// tensors. It holds the inputs with shapes, every node (name, op, inputs, outputs, typed
// attributes, the names, shapes and dtypes of its parameters and buffers) and the outputs; it
// holds no tensor data and nothing executable.
//
// Layout (format "whittle.graph", version 1):
//   {"format": "whittle.graph", "version": 1,
//    "inputs": [{"name": "x", "shape": [1, 3, 32, 32]}],
//    "nodes": [{"name": "conv1", "op": "conv2d", "inputs": ["x"], "outputs": ["conv1"],
//               "attrs": {"stride": {"type": "ints", "value": [1, 1]}},
//               "params": [{"name": "weight", "shape": [16, 3, 3, 3], "dtype": "float32"}],
//               "buffers": [...]}],
//    "outputs": ["fc"]}
// Attribute types: "int", "float", "string", "ints", "floats".

#include <ATen/Tensor.h>

#include <functional>
#include <string>

#include "graph/graph.h"

namespace whittle {

/// What a tensor slot of a serialized node is: parameter or buffer.
enum class TensorRole { kParam, kBuffer };

/// Supplies the tensor for node `node`'s parameter or buffer `name` when a graph is read back;
/// `shape` and `dtype` are what the structure records (the source must check them).
using TensorSource = std::function<at::Tensor(const std::string& node, TensorRole role, const std::string& name,
                                              const Shape& shape, at::ScalarType dtype)>;

/// JSON text of the graph's structure (deterministic: same graph, same text).
std::string graph_to_json(const Graph& graph);

/// Rebuilds a graph from graph_to_json() text, taking tensors from `source` (when empty, tensors
/// are zero-filled with the recorded shape and dtype). Parameters are made requires_grad leaves.
/// Throws whittle::Error naming the offending node or key for malformed text, an unknown op, a
/// tensor whose shape or dtype differs from the record, or a graph that fails validation.
/// `origin` names the source (a file path) in error messages.
Graph graph_from_json(const std::string& json_text, const TensorSource& source = {},
                      const std::string& origin = "graph");

/// "float32", "int64", ... (as NumPy names dtypes); throws whittle::Error for others.
std::string dtype_name(at::ScalarType dtype);
/// Inverse of dtype_name; throws whittle::Error naming `name` when unknown.
at::ScalarType dtype_from_name(const std::string& name);

}  // namespace whittle
