// `whittle prune MODEL --out FILE`: one-shot channel pruning of a checkpoint, zoo model or
// TorchScript file, written as a checkpoint whose tensors are really smaller (docs/pruning.md).

#include <ATen/ATen.h>

#include <boost/program_options.hpp>

#include <chrono>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "export/checkpoint.h"
#include "graph/graph_module.h"
#include "graph/select.h"
#include "prune/prune.h"
#include "tools/command.h"
#include "tools/model_source.h"

namespace po = boost::program_options;

namespace whittle::cli {

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int run_prune(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle prune MODEL --out FILE [--criterion l1] [--sparsity S | --target-macs F | --target-params F]\n"
      "                     [--global] [--round-to N] [--min-channels N] [--targets A,B] [--ignore A,B] [--groups]\n\n"
      "Removes the least important output channels of the model's layers, with every tensor coupled to\n"
      "them (residual adds, concatenations, depthwise and grouped convolutions, flatten → linear), and\n"
      "writes a checkpoint whose tensors are smaller. MODEL is a whittle checkpoint (.h5), a TorchScript\n"
      "file (.pt, needs --input-shape) or a zoo model name. Fine-tune the result with a recipe\n"
      "(model: {file: FILE}) to recover accuracy. --groups prints the dependency groups and stops.\n\n"
      "example:\n  whittle prune runs/mnist/lenet5/model.h5 --criterion l1 --target-macs 0.5 --out pruned.h5\n\noptions");
  std::string model, out, shape_text, criterion = "l1", targets, ignore;
  double sparsity = 0.5, target_macs = 0, target_params = 0;
  int64_t round_to = 1, min_channels = 1;
  opts.add_options()("help,h", "this text")("out", po::value<std::string>(&out), "checkpoint to write")(
      "criterion", po::value<std::string>(&criterion), "l1 (default), l2, bn_scale, fpgm or random")(
      "sparsity", po::value<double>(&sparsity), "fraction of each group's channels removed (default 0.5)")(
      "target-macs", po::value<double>(&target_macs), "keep this fraction of the MACs (0 < F ≤ 1)")(
      "target-params", po::value<double>(&target_params), "keep this fraction of the parameters")(
      "global", "rank all channels together instead of the same fraction per group")(
      "group-mean", "combine a group's member scores by their mean (default: sum)")(
      "round-to", po::value<int64_t>(&round_to), "kept channels a multiple of N")(
      "min-channels", po::value<int64_t>(&min_channels), "no group keeps fewer than N (default 1)")(
      "targets", po::value<std::string>(&targets), "layers whose output channels may go (names, op kinds, re:...)")(
      "ignore", po::value<std::string>(&ignore), "layers to leave alone")(
      "groups", "print the dependency groups and stop")(
      "no-fold", "do not fold removed channels' constant outputs into the next biases")(
      "input-shape", po::value<std::string>(&shape_text), "example input shape of a TorchScript model (N,C,H,W)")(
      "num-classes", po::value<int64_t>()->default_value(10), "classes of a zoo model");
  po::variables_map vm = parse_command_line(args, opts, {{"model", &model}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (model.empty()) throw Error("prune: missing MODEL (see whittle prune --help)", ErrorKind::kUsage);
  const bool groups_only = vm.count("groups") > 0;
  if (out.empty() && !groups_only) throw Error("prune: missing --out FILE (see whittle prune --help)", ErrorKind::kUsage);
  if (!out.empty() && path_exists(model) && is_same_or_inside(out, model))
    throw Error("prune: --out " + out + " is the input model " + model + "; write the pruned model elsewhere",
                ErrorKind::kUsage);
  if (!out.empty()) check_writable_file("prune", out, "--out");
  // One way to say how much goes; a fraction given is one the plan can reach.
  const int amounts = static_cast<int>(vm.count("sparsity") + vm.count("target-macs") + vm.count("target-params"));
  if (amounts > 1)
    throw Error("prune: give one of --sparsity, --target-macs and --target-params", ErrorKind::kUsage);
  for (const auto& [flag, v] : {std::pair<const char*, double>{"--target-macs", target_macs}, {"--target-params", target_params}})
    if (vm.count(flag + 2) && !(v > 0 && v <= 1)) {
      std::ostringstream got;
      got << v;
      throw Error(std::string("prune: ") + flag + " is the fraction kept, in (0, 1]; got " + got.str(),
                  ErrorKind::kUsage);
    }

  std::optional<Shape> shape;
  if (!shape_text.empty()) shape = parse_shape(shape_text, "--input-shape");
  runner::ModelMetadata meta;
  Graph graph =
      load_cli_model("prune", model, shape, vm["num-classes"].as<int64_t>(), !vm["num-classes"].defaulted(), &meta);
  if (groups_only) {
    for (const auto& g : prune::dependency_groups(graph)) std::cout << g.to_string();
    return 0;
  }
  prune::Config c;
  c.scoring.criterion = prune::criterion_from_name(criterion);
  if (c.scoring.criterion == prune::Criterion::kTaylor)
    throw Error("prune: criterion 'taylor' needs gradients from training; use the recipe modifier 'prune'",
                ErrorKind::kUsage);
  c.scoring.mean_over_members = vm.count("group-mean") > 0;
  c.sparsity = sparsity;
  c.target_macs = target_macs;
  c.target_params = target_params;
  c.global = vm.count("global") > 0;
  c.round_to = round_to;
  c.min_channels = min_channels;
  c.targets = split_list(targets);
  c.ignore = split_list(ignore);
  try {
    require_matches(graph, c.targets, "--targets");
    require_matches(graph, c.ignore, "--ignore");
  } catch (const Error& e) {
    throw Error(std::string("prune: ") + e.what(), ErrorKind::kUsage);
  }
  c.fold_constant_outputs = vm.count("no-fold") == 0;
  GraphModule module(std::move(graph));
  module->eval();
  const auto t0 = std::chrono::steady_clock::now();
  const prune::Report r = prune::prune(module, c);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << r.summary() << "pruning time: " << seconds << " s (groups, scores, plan, removal)\n";
  // The checkpoint keeps the recipe it came from; its metrics were the unpruned model's.
  save_checkpoint(out, module->graph(), meta.recipe, "");
  std::cout << "wrote " << out << "\n";
  return 0;
}

}  // namespace whittle::cli
