#include "runner/model_loader.h"

#include <algorithm>

#include "core/error.h"
#include "core/file_util.h"
#include "export/checkpoint.h"
#include "graph/torchscript_import.h"
#include "graph/zoo.h"

namespace whittle::runner {

Graph load_model(const ModelSource& source, ModelMetadata* metadata) {
  ModelMetadata local;
  ModelMetadata& meta = metadata ? *metadata : local;
  meta = ModelMetadata{};
  if (source.name.empty() == source.file.empty())
    throw Error("a model is either a zoo name or a file (got " +
                    (source.name.empty() ? std::string("neither") : "'" + source.name + "' and '" + source.file + "'") +
                    ")",
                ErrorKind::kUsage);
  if (!source.name.empty()) {
    const auto names = zoo_models();
    if (std::find(names.begin(), names.end(), source.name) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      throw Error("unknown model '" + source.name + "': not a file, and not a zoo model (" + list + ")",
                  ErrorKind::kUsage);
    }
    ZooOptions z;
    z.num_classes = source.num_classes;
    z.input_shape = source.input_shape;
    z.seed = source.seed;
    z.weight_init = source.weight_init;
    meta.kind = ModelMetadata::Kind::kZoo;
    return build_model(source.name, z);
  }
  const std::string& file = source.file;
  if (!path_exists(file)) throw Error("model file " + file + " does not exist", ErrorKind::kUsage);
  if (!is_regular_file(file) || file_size(file) == 0)
    throw Error("model file " + file + " is " + describe_path(file) +
                    ", not a whittle checkpoint (.h5) or a TorchScript file (.pt)",
                ErrorKind::kUsage);
  const std::string ext = file_extension(file);
  if (ext == ".h5" || ext == ".hdf5" || is_hdf5_file(file)) {
    Checkpoint c = load_checkpoint(file);
    meta.kind = ModelMetadata::Kind::kCheckpoint;
    meta.recipe = std::move(c.recipe);
    meta.metrics = std::move(c.metrics);
    return std::move(c.graph);
  }
  if (source.input_shape.empty())
    throw Error("TorchScript model " + file + " needs an input shape (--input-shape N,C,H,W, or model.input_shape)",
                ErrorKind::kUsage);
  meta.kind = ModelMetadata::Kind::kTorchScript;
  return import_torchscript(file, source.input_shape);
}

}  // namespace whittle::runner
