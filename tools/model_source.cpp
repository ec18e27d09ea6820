#include "tools/model_source.h"

#include <sstream>

#include "export/checkpoint.h"
#include "core/error.h"
#include "core/file_util.h"
#include "graph/torchscript_import.h"
#include "graph/zoo.h"

namespace whittle::cli {

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::vector<std::string> zoo_model_names() { return zoo_models(); }

Shape parse_shape(const std::string& text, const std::string& what) {
  Shape shape;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      shape.push_back(v);
    } catch (const std::exception&) {
      throw Error(what + ": '" + text + "' is not a comma-separated list of positive integers (e.g. 1,3,32,32)",
                  ErrorKind::kUsage);
    }
  }
  if (shape.empty()) throw Error(what + ": empty shape", ErrorKind::kUsage);
  return shape;
}

Graph load_model_graph(const ModelRequest& request) {
  const std::string& spec = request.spec;
  const std::string ext = file_extension(spec);
  if (ext == ".pt" || ext == ".pth" || ext == ".ts" || ext == ".torchscript") {
    if (!request.input_shape)
      throw Error("TorchScript model " + spec + " needs --input-shape (e.g. --input-shape 1,3,224,224)", ErrorKind::kUsage);
    return import_torchscript(spec, *request.input_shape);
  }
  if (ext == ".h5" || ext == ".hdf5" || (path_exists(spec) && is_hdf5_file(spec))) return load_checkpoint(spec).graph;
  const auto names = zoo_models();
  if (std::find(names.begin(), names.end(), spec) == names.end()) {
    if (path_exists(spec))
      throw Error(spec + ": unrecognized model file (expected a TorchScript .pt or a whittle checkpoint .h5)", ErrorKind::kUsage);
    throw Error("unknown model '" + spec + "': not a file, and not a zoo model (" + join(names, ", ") + ")", ErrorKind::kUsage);
  }
  ZooOptions opts;
  opts.num_classes = request.num_classes;
  if (request.input_shape) opts.input_shape = *request.input_shape;
  return build_model(spec, opts);
}

}  // namespace whittle::cli
