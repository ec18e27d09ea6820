// `whittle run RECIPE`: trains and evaluates as the recipe says; `whittle eval CHECKPOINT`.

#include <ATen/ATen.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <iomanip>
#include <iostream>

#include "data/load.h"
#include "data/loader.h"
#include "export/checkpoint.h"
#include "core/error.h"
#include "graph/graph_module.h"
#include "runner/recipe.h"
#include "runner/trainer.h"
#include "tools/command.h"

namespace po = boost::program_options;

namespace whittle::cli {

int run_run(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle run RECIPE [--out DIR] [--set key=value]... [--resume] [--device cpu|cuda]\n\n"
      "Trains and evaluates the model of a YAML recipe (docs/recipes.md) and writes a run directory\n"
      "with the checkpoint, metrics.jsonl, report.json and a resumable training state.\n"
      "Ctrl-C saves the training state; --resume continues from it.\n\n"
      "example:\n  whittle run recipes/mnist/lenet5.yaml --set training.epochs=2 --out runs/quick\n\noptions");
  std::string recipe_path, out, device;
  std::vector<std::string> sets;
  opts.add_options()("help,h", "this text")("out", po::value<std::string>(&out), "run directory (default: recipe outputs.dir)")(
      "set", po::value<std::vector<std::string>>(&sets)->composing(), "override a recipe key: path.to.key=value (repeatable)")(
      "resume", "continue the run in the run directory")("device", po::value<std::string>(&device), "cpu, cuda or cuda:N");
  po::variables_map vm = parse_command_line(args, opts, {{"recipe", &recipe_path}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (recipe_path.empty()) throw Error("run: missing RECIPE (see whittle run --help)", ErrorKind::kUsage);
  if (!device.empty() && !runner::is_device_name(device))
    throw Error("--device '" + device + "': expected cpu, cuda or cuda:N", ErrorKind::kUsage);
  runner::Recipe recipe = runner::load_recipe(recipe_path, sets);
  runner::RunOptions ro;
  ro.out_dir = out;
  ro.device = device;
  ro.resume = vm.count("resume") > 0;
  runner::install_sigint_handler();
  runner::RunResult res = runner::run_recipe(recipe, ro);
  return res.interrupted ? 130 : 0;
}

int run_eval(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle eval CHECKPOINT [--data PATH] [--split NAME] [--batch-size N] [--device cpu|cuda] [--json]\n\n"
      "Evaluates a checkpoint. Without --data it uses the test set and normalization of the recipe\n"
      "stored in the checkpoint.\n\n"
      "example:\n  whittle eval runs/mnist/lenet5/model.h5\n\noptions");
  std::string ckpt_path, data_path, split, device = "cpu";
  int64_t batch_size = 500;
  opts.add_options()("help,h", "this text")("data", po::value<std::string>(&data_path), "dataset to evaluate on")(
      "split", po::value<std::string>(&split), "split of --data (default: the recipe's test split, else 'test')")(
      "batch-size", po::value<int64_t>(&batch_size)->default_value(500), "evaluation batch size")(
      "device", po::value<std::string>(&device)->default_value("cpu"), "cpu, cuda or cuda:N")("json", "print JSON");
  po::variables_map vm = parse_command_line(args, opts, {{"checkpoint", &ckpt_path}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (ckpt_path.empty()) throw Error("eval: missing CHECKPOINT (see whittle eval --help)", ErrorKind::kUsage);
  if (batch_size < 1) throw Error("eval: --batch-size must be ≥ 1", ErrorKind::kUsage);
  const at::Device dev = runner::open_device(device);
  Checkpoint ck = load_checkpoint(ckpt_path);
  std::vector<double> mean, stddev;
  std::string pack_to;
  if (!ck.recipe.empty()) {
    try {
      YAML::Node root = YAML::Load(ck.recipe);
      if (root["data"]) {
        if (root["data"]["mean"]) mean = root["data"]["mean"].as<std::vector<double>>();
        if (root["data"]["std"]) stddev = root["data"]["std"].as<std::vector<double>>();
        if (data_path.empty() && root["data"]["test"]) {
          data_path = root["data"]["test"].as<std::string>();
          // The run's HDF5 copy of an image folder or archive, when it packed one.
          if (root["data"]["pack_to"]) pack_to = root["data"]["pack_to"].as<std::string>();
        }
        if (split.empty() && root["data"]["test_split"]) split = root["data"]["test_split"].as<std::string>();
      }
    } catch (const YAML::Exception& e) {
      throw Error(ckpt_path + ": the stored recipe is not valid YAML: " + e.msg);
    }
  }
  if (data_path.empty())
    throw Error("eval: the checkpoint holds no recipe naming a test set; give --data", ErrorKind::kUsage);
  data::Dataset ds = runner::load_split(data_path, split.empty() ? "test" : split, pack_to, std::cerr);
  data::LoaderOptions opts_l;
  opts_l.batch_size = batch_size;
  opts_l.shuffle = false;
  opts_l.transform.mean = mean;
  opts_l.transform.stddev = stddev;
  data::DataLoader loader(std::move(ds), opts_l);
  GraphModule model(std::move(ck.graph));
  model->to(dev);
  runner::EvalMetrics m = runner::evaluate(model, loader, dev);
  if (vm.count("json")) {
    nlohmann::ordered_json j{{"checkpoint", ckpt_path}, {"data", data_path}, {"top1", m.top1},
                             {"top5", m.top5},          {"loss", m.loss},    {"samples", m.samples}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << ckpt_path << " on " << data_path << " (" << m.samples << " images): top-1 " << std::fixed
              << std::setprecision(2) << 100 * m.top1 << "%, top-5 " << 100 * m.top5 << "%, loss "
              << std::setprecision(4) << m.loss << "\n";
  }
  return 0;
}

int run_data(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle data pack SRC --to FILE.h5 [--split NAME]\n\n"
      "Packs a dataset (MNIST IDX, CIFAR-10 binary, image folder) into one contiguous HDF5 file\n"
      "(images uint8 N×C×H×W, labels int64; docs/data.md).\n\n"
      "example:\n  whittle data pack data/mnist10k --split train --to mnist-train.h5\n\noptions");
  std::string action, src, to, split = "train";
  opts.add_options()("help,h", "this text")("to", po::value<std::string>(&to), "output HDF5 file")(
      "split", po::value<std::string>(&split)->default_value("train"), "split to read (train, test, t10k)");
  po::variables_map vm = parse_command_line(args, opts, {{"action", &action}, {"src", &src}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (action != "pack") throw Error("data: unknown action '" + action + "' (only 'pack')", ErrorKind::kUsage);
  if (src.empty() || to.empty()) throw Error("data pack: needs SRC and --to FILE.h5", ErrorKind::kUsage);
  data::LoadOptions lo;
  lo.split = split;
  data::Dataset ds = data::pack_dataset(src, to, lo);
  std::cout << "packed " << ds.size() << " images [" << ds.channels() << ", " << ds.height() << ", " << ds.width()
            << "] in " << ds.num_classes() << " classes to " << to << "\n";
  return 0;
}

}  // namespace whittle::cli
