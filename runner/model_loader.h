#pragma once
// One way to get a model graph from what a user names: a zoo model (built with fresh weights) or a
// file (a whittle checkpoint or a TorchScript module). The trainer (`model:` of a recipe), and the
// `eval`, `fuse` and `inspect` commands load their models through it.

#include <cstdint>
#include <optional>
#include <string>

#include "graph/graph.h"
#include "graph/weight_init.h"

namespace whittle::runner {

/// Where a model comes from: exactly one of `name` (a zoo model, graph/zoo.h) and `file`.
struct ModelSource {
  std::string name;              ///< zoo model name (one of zoo_models()), or
  std::string file;              ///< a whittle checkpoint (.h5/.hdf5, or any file with the HDF5
                                 ///< signature) or else a TorchScript file
  int64_t num_classes = 10;      ///< zoo: classifier outputs
  WeightInit weight_init = WeightInit::kTorch;  ///< zoo: how conv weights are drawn
  std::optional<uint64_t> seed;  ///< zoo: initialization seed (unset: LibTorch's global CPU generator)
  Shape input_shape;             ///< example input [N, C, H, W]; zoo: empty = the model's default;
                                 ///< TorchScript: required; checkpoint: ignored (the file has one)
};

/// What a loaded file carried besides the graph.
struct ModelMetadata {
  enum class Kind { kZoo, kCheckpoint, kTorchScript };
  Kind kind = Kind::kZoo;
  std::string recipe;   ///< checkpoint: the recipe YAML that produced it ("" when none)
  std::string metrics;  ///< checkpoint: its metrics JSON ("" when none)
};

/// The graph of `source`: build_model(name, {num_classes, input_shape, seed, weight_init}) for a zoo model;
/// load_checkpoint(file).graph for a checkpoint; import_torchscript(file, input_shape) otherwise.
/// Fills `metadata` when given. Throws whittle::Error (usage) when both or neither of name and
/// file are given, for an unknown zoo name (listing the models), a file that does not exist, or a
/// TorchScript file without input_shape; whittle::Error from the zoo, the checkpoint reader or
/// the importer otherwise.
Graph load_model(const ModelSource& source, ModelMetadata* metadata = nullptr);

}  // namespace whittle::runner
