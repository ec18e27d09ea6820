// `whittle prune MODEL --out FILE`: one-shot channel pruning of a checkpoint, zoo model or
// TorchScript file, written as a checkpoint whose tensors are really smaller (docs/pruning.md).

#include <ATen/ATen.h>

#include <boost/program_options.hpp>

#include <chrono>
#include <iostream>

#include "core/error.h"
#include "core/file_util.h"
#include "export/checkpoint.h"
#include "graph/graph_module.h"
#include "graph/pass_registry.h"
#include "graph/select.h"
#include "prune/prune.h"
#include "tools/command.h"
#include "tools/model_source.h"
#include "tools/option_flags.h"

namespace po = boost::program_options;

namespace whittle::cli {

int run_prune(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle prune MODEL --out FILE [--overwrite] [--criterion l1] [--sparsity S | --target-macs F | --target-params F]\n"
      "                     [--group-reduction mean] [--global] [--round-to N] [--min-channels N]\n"
      "                     [--targets A,B] [--ignore A,B] [--no-fold-constant-outputs] [--groups]\n\n"
      "Removes the least important output channels of the model's layers, with every tensor coupled to\n"
      "them (residual adds, concatenations, depthwise and grouped convolutions, flatten → linear), and\n"
      "writes a checkpoint whose tensors are smaller. MODEL is a whittle checkpoint (.h5), a TorchScript\n"
      "file (.pt, needs --input-shape) or a zoo model name. Fine-tune the result with a recipe\n"
      "(model: {file: FILE}) to recover accuracy. --groups prints the dependency groups and stops. The\n"
      "options are those of the pass prune (whittle inspect --passes) and of the recipe's prune modifier.\n\n"
      "example:\n  whittle prune runs/mnist/lenet5/model.h5 --criterion l1 --target-macs 0.5 --out pruned.h5\n\noptions");
  std::string model, out, shape_text;
  opts.add_options()("help,h", "this text")("out", po::value<std::string>(&out), "checkpoint to write")(
      "overwrite", "replace an existing --out file")(
      "groups", "print the dependency groups and stop")(
      "input-shape", po::value<std::string>(&shape_text), "example input shape of a TorchScript model (N,C,H,W)")(
      "num-classes", po::value<int64_t>()->default_value(10), "classes of a zoo model");
  OptionFlags flags;
  flags.add(opts, pass_info("prune").options);
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
  if (!out.empty()) check_writable_file("prune", out, "--out", vm.count("overwrite") > 0);
  const PassCall call{flags.settings(vm, "prune"), OptionSource{"prune", KeyStyle::kFlag}};
  // The options checked before the model is read (the pass checks them again, with the model).
  prune::pass_options(call.settings, call.source);

  std::optional<Shape> shape;
  if (!shape_text.empty()) shape = parse_shape(shape_text, "--input-shape");
  runner::ModelMetadata meta;
  Graph graph =
      load_cli_model("prune", model, shape, vm["num-classes"].as<int64_t>(), !vm["num-classes"].defaulted(), &meta);
  if (groups_only) {
    for (const auto& g : prune::dependency_groups(graph)) std::cout << g.to_string();
    return 0;
  }
  GraphModule module(std::move(graph));
  module->eval();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string report = run_on_module(module, "prune", ModuleMode::kAny, [&](Graph& g) { return run_pass("prune", g, call); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << report << "pruning time: " << seconds << " s (groups, scores, plan, removal)\n";
  // The checkpoint keeps the recipe it came from; its metrics were the unpruned model's.
  save_checkpoint(out, module->graph(), meta.recipe, "");
  std::cout << "wrote " << out << "\n";
  return 0;
}

}  // namespace whittle::cli
