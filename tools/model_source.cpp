#include "tools/model_source.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "core/shape_limits.h"
#include "core/file_util.h"
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
  if (!shape_within_limit(shape))
    throw Error(what + ": '" + text + "' has more than 2^40 elements (a tensor of that shape could not be allocated)",
                ErrorKind::kUsage);
  return shape;
}

runner::ModelSource model_source(const std::string& spec, const std::optional<Shape>& input_shape,
                                 int64_t num_classes) {
  runner::ModelSource source;
  const std::string ext = file_extension(spec);
  const bool file_like = ext == ".h5" || ext == ".hdf5" || ext == ".pt" || ext == ".pth" || ext == ".ts" ||
                         ext == ".torchscript";
  const auto zoo = zoo_models();
  const bool zoo_name = std::find(zoo.begin(), zoo.end(), spec) != zoo.end();
  if (file_like || (!zoo_name && path_exists(spec))) source.file = spec;
  else source.name = spec;
  source.num_classes = num_classes;
  if (input_shape) source.input_shape = *input_shape;
  return source;
}

Graph load_cli_model(const std::string& command, const std::string& spec, const std::optional<Shape>& input_shape,
                     int64_t num_classes, bool num_classes_given, runner::ModelMetadata* meta) {
  runner::ModelMetadata local;
  runner::ModelMetadata& m = meta ? *meta : local;
  Graph graph = runner::load_model(model_source(spec, input_shape, num_classes), &m);
  if (m.kind == runner::ModelMetadata::Kind::kCheckpoint && (input_shape || num_classes_given))
    throw Error(command + ": --input-shape and --num-classes apply to TorchScript files and zoo models; " + spec +
                    " is a checkpoint, which keeps its own",
                ErrorKind::kUsage);
  if (m.kind == runner::ModelMetadata::Kind::kTorchScript && num_classes_given)
    throw Error(command + ": --num-classes applies to zoo models; " + spec + " is a TorchScript file",
                ErrorKind::kUsage);
  return graph;
}

void check_images_fit(const std::string& command, const Graph& graph, const Shape& shape, const std::string& data_path,
                      const std::string& model) {
  if (graph.inputs().size() != 1) return;
  const Shape& in = graph.value(graph.inputs().front()).shape;
  if (in.size() == 4 && !std::equal(shape.begin(), shape.end(), in.begin() + 1))
    throw Error(command + ": the images of " + data_path + " are " + shape_str(shape) + " (C, H, W) but the model " +
                    model + " takes " + shape_str(Shape(in.begin() + 1, in.end())) + " (its input " + shape_str(in) + ")",
                ErrorKind::kUsage);
}

}  // namespace whittle::cli
