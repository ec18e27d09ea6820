#pragma once
// The MODEL argument of the command-line program: a zoo name or a file (a whittle checkpoint or a
// TorchScript module), turned into a runner::ModelSource for runner::load_model.

#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "runner/model_loader.h"

namespace whittle::cli {

/// The ModelSource of MODEL argument `spec`: a file when `spec` ends in a model file extension
/// (.h5, .hdf5, .pt, .pth, .ts, .torchscript) or, not being a zoo name, names an existing path;
/// else a zoo name (load_model reports an unknown one).
/// `input_shape` (--input-shape) goes to zoo models and TorchScript files; `num_classes`
/// (--num-classes) to zoo models. Zoo models take LibTorch's global generator (no seed).
runner::ModelSource model_source(const std::string& spec, const std::optional<Shape>& input_shape,
                                 int64_t num_classes);

/// Loads MODEL argument `spec` (model_source, then runner::load_model, filling `meta` when given).
/// `input_shape` (--input-shape) applies to TorchScript files and zoo models, and --num-classes
/// (`num_classes`, `num_classes_given` when the user set it) to zoo models: given for a model that
/// keeps its own (a checkpoint; a TorchScript file for --num-classes), they throw a usage
/// whittle::Error led by `command` rather than being ignored.
Graph load_cli_model(const std::string& command, const std::string& spec, const std::optional<Shape>& input_shape,
                     int64_t num_classes, bool num_classes_given, runner::ModelMetadata* meta = nullptr);

/// Checks that images of `shape` (C, H, W) from `data_path` are what a single-input `graph` (MODEL
/// `model`) takes; throws a usage whittle::Error led by `command` naming both shapes. Graphs with
/// several inputs or a non-image input are not checked.
void check_images_fit(const std::string& command, const Graph& graph, const Shape& shape, const std::string& data_path,
                      const std::string& model);

/// Names of the zoo models.
std::vector<std::string> zoo_model_names();

/// "1,3,32,32" → {1, 3, 32, 32}; throws a usage whittle::Error naming `what` when malformed.
Shape parse_shape(const std::string& text, const std::string& what);

/// Joins strings with a separator.
std::string join(const std::vector<std::string>& parts, const std::string& sep);

}  // namespace whittle::cli
