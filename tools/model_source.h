#pragma once
// Resolving the MODEL argument of the command-line program: a zoo name, a TorchScript file, or
// (later) a whittle checkpoint.

#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace whittle::cli {

/// What the user named as a model.
struct ModelRequest {
  std::string spec;                  ///< zoo name or file path
  std::optional<Shape> input_shape;  ///< example input shape; required for TorchScript files
  int64_t num_classes = 10;          ///< for zoo models
};

/// Builds the graph for `request`. Throws whittle::Error (usage kind) for an unknown name or a
/// missing --input-shape, and whittle::Error for files that fail to load.
Graph load_model_graph(const ModelRequest& request);

/// Names of the zoo models.
std::vector<std::string> zoo_model_names();

/// "1,3,32,32" → {1, 3, 32, 32}; throws a usage whittle::Error naming `what` when malformed.
Shape parse_shape(const std::string& text, const std::string& what);

/// Joins strings with a separator.
std::string join(const std::vector<std::string>& parts, const std::string& sep);

}  // namespace whittle::cli
