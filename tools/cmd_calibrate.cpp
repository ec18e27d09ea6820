// `whittle calibrate MODEL --data D --out FILE`: post-training int8 quantization. Batch norms are
// folded into the layers before them (fuse_for_inference), then the layers
// get the int8 method's quantizers (quantize/int8.cpp), every activation scale and zero point is
// set by a calibrator over a few batches of the training split with the evaluation transforms (no
// optimizer step), and the result is written as a packed checkpoint (docs/quantization.md).

#include <ATen/ATen.h>

#include <boost/program_options.hpp>

#include <chrono>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "data/loader.h"
#include "export/checkpoint.h"
#include "graph/graph_module.h"
#include "graph/pass_registry.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "runner/model_loader.h"
#include "runner/recipe.h"
#include "runner/trainer.h"
#include "tools/command.h"
#include "tools/model_source.h"
#include "tools/option_flags.h"

namespace po = boost::program_options;

namespace whittle::cli {

namespace {

// "0.49,0.48,0.45" → numbers; throws a usage error naming `what`.
std::vector<double> parse_numbers(const std::string& text, const std::string& what) {
  std::vector<double> out;
  for (const auto& item : split_commas(text)) {
    try {
      size_t used = 0;
      out.push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error("calibrate: " + what + " '" + text + "' is not a comma-separated list of numbers", ErrorKind::kUsage);
    }
  }
  if (out.empty()) throw Error("calibrate: " + what + " is empty", ErrorKind::kUsage);
  return out;
}

}  // namespace

int run_calibrate(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle calibrate MODEL --out FILE [--data PATH] [--method minmax|moving_minmax|percentile|entropy|mse]\n"
      "                         [--batches N] [--batch-size N] [--split NAME] [--seed N] [--mean A,B,C --std A,B,C]\n"
      "                         [--activation-dtype uint8|int8] [--granularity per_channel|per_tensor] [--no-narrow-range]\n"
      "                         [--percentile P] [--targets A,B] [--ignore A,B] [--bias-correction] [--no-fold] [--eval]\n"
      "                         [--overwrite]\n\n"
      "Post-training int8 quantization: folds batch norms into the layers before them (the pass\n"
      "fuse_for_inference, as integer runtimes run them; --no-fold keeps them), gives the layers the int8\n"
      "method's quantizers (weights symmetric per output channel, activations uint8 affine or int8\n"
      "symmetric; every layer, the first and last too, and the inputs of the residual additions joining\n"
      "them, so that integer runtimes run the whole network in int8), sets every\n"
      "activation scale and zero point with a calibrator over --batches batches of the training split\n"
      "(shuffled with --seed, evaluation transforms: normalized, no crop or flip), with no optimizer\n"
      "step, and writes a packed checkpoint.\n"
      "MODEL is a whittle checkpoint (.h5; its stored recipe gives the normalization and the data), a\n"
      "TorchScript file (.pt, needs --input-shape) or a zoo model name. --eval evaluates the float model\n"
      "and the int8 one on the test split of --data. Fine-tune the result with a recipe for int8 QAT.\n\n"
      "example:\n  whittle calibrate runs/cifar10/resnet20_budget/model.h5 --method entropy --out int8.h5 --eval\n\noptions");
  std::string model, out, data_path, split, eval_split, method, shape_text, mean_text, std_text, targets, ignore, device = "cpu";
  int64_t batches = 4, batch_size = 128, seed = 0;
  opts.add_options()("help,h", "this text")("out", po::value<std::string>(&out), "checkpoint to write")(
      "overwrite", "replace an existing --out file")(
      "data", po::value<std::string>(&data_path), "dataset (default: the training set of the checkpoint's recipe)")(
      "split", po::value<std::string>(&split), "split of --data the statistics come from (default: the recipe's training split, else train)")(
      "method", po::value<std::string>(&method), "the calibrator (whittle inspect --calibrators; default minmax)")(
      "batches", po::value<int64_t>(&batches)->default_value(4), "batches the statistics come from")(
      "batch-size", po::value<int64_t>(&batch_size)->default_value(128), "images a batch")(
      "seed", po::value<int64_t>(&seed)->default_value(0), "seeds the order the images are drawn in")(
      "mean", po::value<std::string>(&mean_text), "normalization mean per channel (default: the recipe's)")(
      "std", po::value<std::string>(&std_text), "normalization standard deviation per channel (default: the recipe's)")(
      "targets", po::value<std::string>(&targets), "layers to quantize: names, op kinds or re:REGEX, comma-separated")(
      "ignore", po::value<std::string>(&ignore), "layers to leave float, as --targets")(
      "weights-only", "int8 weights, float activations (nothing to calibrate)")(
      "bias-correction", "after calibration, correct each quantized layer's bias for the mean error of its int8 weight (Nagel et al. 2019)")(
      "no-fold", "keep batch norms as they are (default: folded into the layers before them first, as runtimes run int8)")(
      "eval", "evaluate the float and the int8 model on the test split of --data")(
      "eval-split", po::value<std::string>(&eval_split), "split --eval uses (default: the recipe's test split, else test)")(
      "device", po::value<std::string>(&device)->default_value("cpu"), "cpu, cuda or cuda:N")(
      "input-shape", po::value<std::string>(&shape_text), "example input shape of a TorchScript model (N,C,H,W)")(
      "num-classes", po::value<int64_t>()->default_value(10), "classes of a zoo model");
  // The int8 method's own keys as flags, but for the two --method and --batches stand for.
  std::vector<KeySpec> keys;
  for (const KeySpec& k : quantize::quantizer_method("int8").option_keys())
    if (k.name != "calibrator" && k.name != "calibration_batches" && k.name != "observe" &&
        k.name != "freeze_observers_epoch")  // QAT's
      keys.push_back(k);
  OptionFlags flags;
  flags.add(opts, keys, "int8");
  po::variables_map vm = parse_command_line(args, opts, {{"model", &model}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (model.empty()) throw Error("calibrate: missing MODEL (see whittle calibrate --help)", ErrorKind::kUsage);
  if (out.empty()) throw Error("calibrate: missing --out FILE (see whittle calibrate --help)", ErrorKind::kUsage);
  if (batches < 1) throw Error("calibrate: --batches must be ≥ 1", ErrorKind::kUsage);
  if (batch_size < 1) throw Error("calibrate: --batch-size must be ≥ 1", ErrorKind::kUsage);
  if (seed < 0) throw Error("calibrate: --seed must be ≥ 0", ErrorKind::kUsage);
  if (path_exists(model) && is_same_or_inside(out, model))
    throw Error("calibrate: --out " + out + " is the input model " + model + "; write the int8 model elsewhere",
                ErrorKind::kUsage);
  check_writable_file("calibrate", out, "--out", vm.count("overwrite") > 0);

  // The quantization, checked before the model is read.
  quantize::Config config;
  config.method = "int8";
  config.options = flags.settings(vm, "calibrate");
  if (vm.count("method")) config.options["calibrator"] = method;  // "" is refused as an unknown calibrator
  config.options["calibration_batches"] = batches;
  if (vm.count("weights-only")) {
    config.activation_bits = 32;
    for (const char* flag : {"method", "percentile", "activation-dtype"})
      if (vm.count(flag))
        throw Error(std::string("calibrate: --") + flag + " applies to the activations, which --weights-only leaves float",
                    ErrorKind::kUsage);
  }
  config.targets = split_commas(targets);
  config.ignore = split_commas(ignore);
  const quantize::Config resolved = quantize::resolve(config);
  // Command-line values that do not parse are usage errors (exit 2), as the flags' own are.
  auto usage = [](const std::function<void()>& parse) {
    try {
      parse();
    } catch (const Error& e) {
      throw Error(e.what(), ErrorKind::kUsage);
    }
  };
  // Nothing to calibrate when the activations stay float.
  const std::optional<quantize::Calibration> cal =
      resolved.activation_bits == 32 ? std::nullopt : quantize::quantizer_method("int8").calibration(resolved);

  std::optional<Shape> shape;
  if (!shape_text.empty()) shape = parse_shape(shape_text, "--input-shape");
  runner::ModelMetadata meta;
  Graph graph =
      load_cli_model("calibrate", model, shape, vm["num-classes"].as<int64_t>(), !vm["num-classes"].defaulted(), &meta);
  // A quantized model has no float weights and activations left to calibrate from.
  for (const Node& n : graph.nodes())
    if (n.op == "act_quant" || !n.weight_transforms.empty())
      throw Error("calibrate: " + model + " is quantized already (node '" + n.name +
                      "'); calibrate takes a float model (the checkpoint it was made from)",
                  ErrorKind::kUsage);
  usage([&] { quantize::select_layers(graph, config); });  // unknown --targets names
  runner::DataSpec recipe_data;
  if (!meta.recipe.empty()) recipe_data = runner::parse_recipe_data(meta.recipe, model + " (stored recipe)");
  if (vm.count("data") && data_path.empty()) throw Error("calibrate: --data is empty", ErrorKind::kUsage);
  std::string pack_to, test_path = data_path;
  if (data_path.empty()) {
    data_path = recipe_data.train;
    test_path = recipe_data.test;
    pack_to = recipe_data.pack_to;  // the run's HDF5 copy of an image folder or archive, when it packed one
    if (data_path.empty())
      throw Error("calibrate: " + model + " holds no recipe naming a training set; give --data", ErrorKind::kUsage);
    if (!path_exists(data_path))
      throw Error("calibrate: the training set " + data_path + " named by " + model +
                      "'s stored recipe (data.train) does not exist here; give --data",
                  ErrorKind::kUsage);
  }
  if (split.empty()) split = recipe_data.train_split.empty() ? "train" : recipe_data.train_split;
  if (eval_split.empty()) eval_split = recipe_data.test_split.empty() ? "test" : recipe_data.test_split;
  data::Transform transform;  // evaluation transforms: normalization alone
  usage([&] {
    transform.mean = mean_text.empty() ? recipe_data.mean : parse_numbers(mean_text, "--mean");
    transform.stddev = std_text.empty() ? recipe_data.std : parse_numbers(std_text, "--std");
  });
  if (transform.mean.empty() && transform.stddev.empty())
    std::cerr << "calibrate: note: no normalization (--mean, --std) given and none stored with " << model
              << ": the images are read as they are, in [0, 1]\n";
  const at::Device dev = runner::open_device(device);

  data::Dataset train = runner::load_split(data_path, split, pack_to, std::cerr);
  check_images_fit("calibrate", graph, Shape{train.channels(), train.height(), train.width()}, data_path, model);
  data::LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.shuffle = true;
  lo.seed = static_cast<uint64_t>(seed);
  lo.num_workers = 0;
  lo.transform = transform;
  const data::DataLoader loader(std::move(train), lo);
  if (batches > loader.num_batches())
    throw Error("calibrate: --batches " + std::to_string(batches) + " is more than the " +
                    std::to_string(loader.num_batches()) + " batches of " + std::to_string(batch_size) + " in " +
                    data_path + " (" + split + ")",
                ErrorKind::kUsage);

  std::optional<data::DataLoader> test_loader;
  if (vm.count("eval")) {
    data::LoaderOptions to;
    to.batch_size = 500;
    to.shuffle = false;
    to.transform = transform;
    test_loader.emplace(runner::load_split(test_path, eval_split, pack_to, std::cerr), to);
  }

  GraphModule module(std::move(graph));
  module->to(dev);
  module->eval();
  std::optional<runner::EvalMetrics> before;
  if (test_loader) before = runner::evaluate(module, *test_loader, dev);

  const auto t0 = std::chrono::steady_clock::now();
  if (!vm.count("no-fold")) {
    const char* pass = "fuse_for_inference";
    std::cout << run_on_module(module, pass, ModuleMode::kEval,
                               [&](Graph& g) { return run_pass(pass, g, PassCall{}); });
  }
  const quantize::Report report = quantize::apply(module, config);
  module->to(dev);
  module->eval();
  int64_t calibrated = 0;
  if (cal) {
    at::NoGradGuard no_grad;
    calibrated = quantize::calibrate_learned(
        module, [&](int64_t i) { return loader.batch(0, i).images.to(dev); }, *cal,
        quantize::nodes_to_initialize(module->graph(), report));
  }
  int64_t corrected = 0;
  if (vm.count("bias-correction"))
    corrected = quantize::correct_bias(module, [&](int64_t i) { return loader.batch(0, i).images.to(dev); }, batches,
                                       report.quantized);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << report.summary();
  if (cal)
    std::cout << "calibrated " << calibrated << " activation quantizer(s) with " << cal->calibrator << " over "
              << cal->batches << " batch(es) of " << batch_size << " images of " << data_path << " (" << split << ")";
  else
    std::cout << "int8 weights, float activations (nothing to calibrate)";
  std::cout << ", " << std::fixed << std::setprecision(2) << seconds << " s\n";
  if (vm.count("bias-correction")) std::cout << "bias correction: " << corrected << " layer(s)\n";
  if (test_loader) {
    const runner::EvalMetrics after = runner::evaluate(module, *test_loader, dev);
    std::cout << "test top-1 on " << test_path << " (" << eval_split << ", " << after.samples << " images): float "
              << 100 * before->top1 << "%, int8 " << 100 * after.top1 << "% (" << std::showpos
              << 100 * (after.top1 - before->top1) << std::noshowpos << " points)\n";
  }
  module->to(at::kCPU);
  save_checkpoint(out, module->graph(), meta.recipe, "");
  std::cout << "wrote " << out << " (" << file_size(out) << " bytes)\n";
  return 0;
}

}  // namespace whittle::cli
