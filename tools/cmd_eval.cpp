// `whittle eval CHECKPOINT`: test accuracy and loss of a checkpoint, on the test set of the recipe
// stored in it or on --data.

#include <ATen/ATen.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iomanip>
#include <iostream>

#include "core/error.h"
#include "core/file_util.h"
#include "data/loader.h"
#include "deploy/model.h"
#include "graph/graph_module.h"
#include "runner/model_loader.h"
#include "runner/recipe.h"
#include "runner/trainer.h"
#include "tools/command.h"
#include "tools/model_source.h"

namespace po = boost::program_options;

namespace whittle::cli {

int run_eval(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle eval CHECKPOINT [--data PATH] [--split NAME] [--batch-size N] [--device cpu|cuda] [--deploy] [--json]\n\n"
      "Evaluates a checkpoint. Without --data it uses the test set and normalization of the recipe\n"
      "stored in the checkpoint. With --deploy it runs the deploy runtime (binary layers on the\n"
      "bitpacked kernels, CPU only; docs/kernels.md) instead of the training graph.\n\n"
      "example:\n  whittle eval runs/mnist/lenet5/model.h5\n  whittle eval runs/mnist/lenet5_bnn/model.h5 --deploy\n\noptions");
  std::string ckpt_path, data_path, split, device = "cpu";
  int64_t batch_size = 500;
  opts.add_options()("help,h", "this text")("data", po::value<std::string>(&data_path), "dataset to evaluate on")(
      "split", po::value<std::string>(&split), "split of --data (default: the recipe's test split, else 'test')")(
      "batch-size", po::value<int64_t>(&batch_size)->default_value(500), "evaluation batch size")(
      "device", po::value<std::string>(&device)->default_value("cpu"), "cpu, cuda or cuda:N")(
      "deploy", "run the deploy runtime (deploy::Model) on the CPU: binary and bit-plane layers on the bitpacked kernels, int8 layers on integer kernels")("json", "print JSON");
  po::variables_map vm = parse_command_line(args, opts, {{"checkpoint", &ckpt_path}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (ckpt_path.empty()) throw Error("eval: missing CHECKPOINT (see whittle eval --help)", ErrorKind::kUsage);
  if (batch_size < 1) throw Error("eval: --batch-size must be ≥ 1", ErrorKind::kUsage);
  // Worded as the other commands word a model file that is not one (runner/model_loader.cpp).
  if (!path_exists(ckpt_path)) throw Error("model file " + ckpt_path + " does not exist", ErrorKind::kUsage);
  if (!is_regular_file(ckpt_path) || file_size(ckpt_path) == 0)
    throw Error("model file " + ckpt_path + " is " + describe_path(ckpt_path) + ", not a whittle checkpoint (.h5)",
                ErrorKind::kUsage);
  if (!is_hdf5_file(ckpt_path))
    throw Error("model file " + ckpt_path + " is not a whittle checkpoint (an HDF5 .h5 file); eval takes a checkpoint",
                ErrorKind::kUsage);
  const bool use_deploy = vm.count("deploy") != 0;
  if (use_deploy && device.rfind("cpu", 0) != 0)
    throw Error("eval: --deploy runs on the CPU; drop --device " + device, ErrorKind::kUsage);
  const at::Device dev = runner::open_device(device);
  runner::ModelSource source;
  source.file = ckpt_path;
  runner::ModelMetadata meta;
  Graph graph = runner::load_model(source, &meta);
  if (meta.kind != runner::ModelMetadata::Kind::kCheckpoint)
    throw Error("eval: " + ckpt_path + " is not a whittle checkpoint (.h5)", ErrorKind::kUsage);
  // The normalization, test set and split of the recipe that produced the checkpoint.
  runner::DataSpec recipe_data;
  if (!meta.recipe.empty()) recipe_data = runner::parse_recipe_data(meta.recipe, ckpt_path + " (stored recipe)");
  std::string pack_to;
  if (vm.count("data") && data_path.empty()) throw Error("eval: --data is empty", ErrorKind::kUsage);
  const bool from_recipe = data_path.empty() && !recipe_data.test.empty();
  if (from_recipe) {
    data_path = recipe_data.test;
    pack_to = recipe_data.pack_to;  // the run's HDF5 copy of an image folder or archive, when it packed one
  }
  if (vm.count("split") && split.empty()) throw Error("eval: --split is empty (e.g. test)", ErrorKind::kUsage);
  if (split.empty()) split = recipe_data.test_split;
  if (data_path.empty())
    throw Error("eval: the checkpoint holds no recipe naming a test set; give --data", ErrorKind::kUsage);
  if (from_recipe && !path_exists(data_path))
    throw Error("eval: the test set " + data_path + " named by " + ckpt_path +
                    "'s stored recipe (data.test) does not exist here; give --data",
                ErrorKind::kUsage);
  data::Dataset ds = runner::load_split(data_path, split.empty() ? "test" : split, pack_to, std::cerr);
  // The data must be what the model takes, before any transform.
  check_images_fit("eval", graph, Shape{ds.channels(), ds.height(), ds.width()}, data_path, ckpt_path);
  data::LoaderOptions opts_l;
  opts_l.batch_size = batch_size;
  opts_l.shuffle = false;
  opts_l.transform.mean = recipe_data.mean;
  opts_l.transform.stddev = recipe_data.std;
  data::DataLoader loader(std::move(ds), opts_l);
  runner::EvalMetrics m;
  if (use_deploy) {
    const deploy::Model model(graph);
    m = runner::evaluate([&model](const at::Tensor& x) { return model.forward(x); }, loader, dev);
  } else {
    GraphModule model(std::move(graph));
    model->to(dev);
    m = runner::evaluate(model, loader, dev);
  }
  if (vm.count("json")) {
    nlohmann::ordered_json j{{"checkpoint", ckpt_path}, {"data", data_path}, {"runtime", use_deploy ? "deploy" : "graph"}, {"top1", m.top1},
                             {"top5", m.top5},          {"loss", m.loss},    {"samples", m.samples}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << ckpt_path << (use_deploy ? " (deploy runtime)" : "") << " on " << data_path << " (" << m.samples
              << " images): top-1 " << std::fixed
              << std::setprecision(2) << 100 * m.top1 << "%, top-5 " << 100 * m.top5 << "%, loss "
              << std::setprecision(4) << m.loss << "\n";
  }
  return 0;
}

}  // namespace whittle::cli
