// `whittle fuse MODEL --out FILE`: the inference fusion passes (RepVGG merging, BN folding,
// BN → threshold, folding of QAT-trained layers) on a checkpoint, written as a new checkpoint.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <boost/program_options.hpp>

#include <iostream>

#include "export/checkpoint.h"
#include "fuse/fuse.h"
#include "core/error.h"
#include "core/file_util.h"
#include "graph/graph_module.h"
#include "graph/pass_registry.h"
#include "tools/command.h"
#include "tools/model_source.h"
#include "tools/option_flags.h"

namespace po = boost::program_options;

namespace whittle::cli {

int run_fuse(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle fuse MODEL --out FILE [--overwrite] [--no-repvgg] [--no-fold] [--no-threshold] [--targets A,B] [--verify]\n\n"
      "Folds batch norms into the layers before them, merges RepVGG blocks into single 3x3 convs,\n"
      "turns BN + sign binarizer pairs into per-channel thresholds and folds QAT-trained layers, using\n"
      "running statistics only, then writes a checkpoint that computes the same outputs (docs/fusion.md).\n"
      "MODEL is a whittle checkpoint (.h5; its recipe and metrics are kept), a TorchScript file (.pt,\n"
      "needs --input-shape) or a zoo model name. The options are those of the pass fuse_for_inference\n"
      "(whittle inspect --passes).\n\n"
      "example:\n  whittle fuse runs/mnist/lenet5_bnn/model.h5 --out runs/mnist/lenet5_bnn/deploy.h5 --verify\n\noptions");
  std::string model, out, shape_text;
  opts.add_options()("help,h", "this text")("out", po::value<std::string>(&out), "checkpoint to write (required)")(
      "overwrite", "replace an existing --out file")(
      "verify", "run the model before and after on a random batch of 4 and print the largest difference")(
      "input-shape", po::value<std::string>(&shape_text), "example input shape of a TorchScript model (N,C,H,W)")(
      "num-classes", po::value<int64_t>()->default_value(10), "classes of a zoo model");
  const char* pass = "fuse_for_inference";
  OptionFlags flags;
  flags.add(opts, pass_info(pass).options);
  po::variables_map vm = parse_command_line(args, opts, {{"model", &model}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (model.empty()) throw Error("fuse: missing MODEL (see whittle fuse --help)", ErrorKind::kUsage);
  if (out.empty()) throw Error("fuse: missing --out FILE (see whittle fuse --help)", ErrorKind::kUsage);
  if (path_exists(model) && is_same_or_inside(out, model))
    throw Error("fuse: --out " + out + " is the input model " + model + "; write the fused model elsewhere", ErrorKind::kUsage);
  check_writable_file("fuse", out, "--out", vm.count("overwrite") > 0);
  const PassCall call{flags.settings(vm, "fuse"), OptionSource{"fuse", KeyStyle::kFlag}};

  std::optional<Shape> shape;
  if (!shape_text.empty()) shape = parse_shape(shape_text, "--input-shape");
  runner::ModelMetadata meta;  // a checkpoint's recipe and metrics are kept
  Graph graph =
      load_cli_model("fuse", model, shape, vm["num-classes"].as<int64_t>(), !vm["num-classes"].defaulted(), &meta);

  const size_t nodes_before = graph.nodes().size();
  GraphModule module(std::move(graph));
  module->eval();
  std::vector<at::Tensor> inputs, before;
  if (vm.count("verify")) {
    at::NoGradGuard no_grad;
    for (const auto& name : module->graph().inputs()) {
      Shape s = module->graph().value(name).shape;
      if (!s.empty()) s[0] = 4;
      inputs.push_back(at::randn(s));
    }
    before = module->forward(inputs);
  }
  std::cout << run_on_module(module, pass, ModuleMode::kEval, [&](Graph& g) { return run_pass(pass, g, call); });
  std::cout << "nodes: " << nodes_before << " → " << module->graph().nodes().size() << "; foldable BN left: "
            << fuse::count_foldable_batchnorm(module->graph()) << "\n";
  if (vm.count("verify")) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> after = module->forward(inputs);
    for (size_t i = 0; i < after.size(); ++i) {
      const double diff = (after[i] - before[i]).abs().max().item<double>();
      const double scale = before[i].abs().max().item<double>();
      std::cout << "verify: output '" << module->graph().outputs()[i] << "' max |fused − original| = " << diff
                << " (max |original| = " << scale << ")\n";
    }
  }
  save_checkpoint(out, module->graph(), meta.recipe, meta.metrics);
  std::cout << "wrote " << out << "\n";
  return 0;
}

}  // namespace whittle::cli
