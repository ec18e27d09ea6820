// `whittle export MODEL --format F --out FILE`: a checkpoint, zoo model or imported TorchScript
// model written by a registered exporter (export/exporter.h) in deploy form (docs/export.md).

#include <ATen/ATen.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>
#include <map>

#include "core/error.h"
#include "core/file_util.h"
#include "export/exporter.h"
#include "export/verify.h"
#include "graph/graph_module.h"
#include "graph/pass_registry.h"
#include "tools/command.h"
#include "tools/model_source.h"
#include "tools/option_flags.h"

namespace po = boost::program_options;

namespace whittle::cli {


int run_export(const std::vector<std::string>& args) {
  std::string formats, extensions;
  for (const auto& name : exporters().names()) {
    formats += (formats.empty() ? "" : "|") + name;
    const Exporter& e = exporter(name);
    std::string exts;
    for (const auto& x : e.extensions()) exts += (exts.empty() ? "" : ", ") + x;
    extensions += (extensions.empty() ? "" : "; ") + name + ": " + exts;
  }
  po::options_description opts(
      "usage: whittle export MODEL --out FILE [--overwrite] [--format " + formats + "] [format options]\n"
      "                      [--fold] [--verify] [--check-data FILE.h5] [--input-shape N,C,H,W]\n\n"
      "Writes MODEL (a whittle checkpoint, a TorchScript file or a zoo model name) in an export format\n"
      "(whittle inspect --exporters), in deploy form: eval mode, QAT batch norms folded, quantized weights\n"
      "decoded (int8 weight grids as int8 codes into DequantizeLinear in ONNX), activation quantizers as\n"
      "plain ops. The format defaults from the extension of --out (" + extensions + ").\n"
      "--fold writes the folded deploy form (batch norms folded into the layers before them, RepVGG blocks\n"
      "merged: the pass fuse_for_inference, as `whittle fuse`): what integer runtimes quantize and run\n"
      "fastest (ONNX Runtime's quantize_static of a file that keeps its BatchNormalization nodes runs\n"
      "slower than the float model).\n"
      "--verify reads the written file back: TorchScript is loaded with torch::jit::load and its outputs on 4\n"
      "random inputs compared with whittle's; ONNX is re-read and checked by the ONNX checker (run outputs\n"
      "with onnxruntime, see docs/export.md). A file that fails is removed.\n"
      "--check-data writes those random inputs and whittle's outputs (HDF5) for checks in other runtimes.\n\n"
      "examples:\n  whittle export runs/mnist/lenet5_dorefa_w4a4/model.h5 --out lenet5_w4a4.onnx\n"
      "  whittle export resnet20 --format torchscript --out resnet20.pt --verify\n\noptions");
  std::string model, out, format, shape_text, check_data;
  opts.add_options()("help,h", "this text")("out", po::value<std::string>(&out), "file to write")(
      "overwrite", "replace an existing --out (and --check-data) file")(
      "format", po::value<std::string>(&format), (formats + " (default: from the --out extension)").c_str())(
      "verify", "check the written file (see above) and print what was found")(
      "fold", "fold batch norms and merge RepVGG blocks first (the folded deploy form)")(
      "check-data", po::value<std::string>(&check_data), "also write random inputs and whittle's outputs for them (HDF5)")(
      "input-shape", po::value<std::string>(&shape_text), "input shape of a TorchScript file or zoo model (N,C,H,W)")(
      "num-classes", po::value<int64_t>()->default_value(10), "classes of a zoo model");
  // Each exporter's options as flags (a flag two formats share is listed once).
  OptionFlags option_flags;
  for (const auto& name : exporters().names()) option_flags.add(opts, exporter(name).option_keys(), name);
  po::variables_map vm = parse_command_line(args, opts, {{"model", &model}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (model.empty()) throw Error("export: missing MODEL (see whittle export --help)", ErrorKind::kUsage);
  if (out.empty()) throw Error("export: missing --out FILE (see whittle export --help)", ErrorKind::kUsage);
  if (path_exists(model) && is_same_or_inside(out, model))
    throw Error("export: --out " + out + " is the input model " + model, ErrorKind::kUsage);
  if (format.empty()) {
    const Exporter* by_extension = exporter_for_path(out);
    if (!by_extension) {
      std::string give;
      for (const auto& name : exporters().names()) give += (give.empty() ? "--format " : " or --format ") + name;
      throw Error("export: cannot tell the format from '" + out + "'; give " + give, ErrorKind::kUsage);
    }
    format = by_extension->name();
  }
  if (!exporters().contains(format)) {
    std::string known;
    for (const auto& name : exporters().names()) known += (known.empty() ? "" : ", ") + name;
    throw Error("export: unknown --format '" + format + "' (" + known + ")", ErrorKind::kUsage);
  }
  const Exporter& ex = exporter(format);
  // The format's options from their flags, typed by the exporter's keys.
  const Settings options = option_flags.settings(vm, "export");
  check_export_options(ex, options, "export");
  if (!check_data.empty() && (is_same_or_inside(check_data, out) || (path_exists(model) && is_same_or_inside(check_data, model))))
    throw Error("export: --check-data " + check_data + " must be another file than MODEL and --out", ErrorKind::kUsage);

  check_writable_file("export", out, "--out", vm.count("overwrite") > 0);
  if (!check_data.empty()) check_writable_file("export", check_data, "--check-data", vm.count("overwrite") > 0);

  std::optional<Shape> shape;
  if (!shape_text.empty()) shape = parse_shape(shape_text, "--input-shape");
  runner::ModelMetadata meta;
  Graph graph =
      load_cli_model("export", model, shape, vm["num-classes"].as<int64_t>(), !vm["num-classes"].defaulted(), &meta);
  if (vm.count("fold")) {
    // The folded deploy form: what `whittle fuse` writes, in memory.
    GraphModule module(std::move(graph));
    module->eval();
    const char* pass = "fuse_for_inference";
    std::cout << run_on_module(module, pass, ModuleMode::kEval, [&](Graph& g) { return run_pass(pass, g, PassCall{}); });
    graph = module->graph().clone();
  }
  ex.check(graph, options);  // an option out of range or an op without a form, before any file
  ExportInfo info;
  info.metadata["source"] = model;
  ex.write(graph, out, options, info);
  std::cout << "wrote " << out << " (" << ex.summary(options) << ", " << file_size(out) << " bytes)\n";
  // Check data at the batch the file accepts (the declared one when the format fixes it).
  const int64_t batch = ex.check_batch(graph, options);
  // Random inputs and whittle's outputs for them, computed once for --check-data and --verify.
  std::optional<CheckData> data;
  if (!check_data.empty() || (vm.count("verify") && ex.verify_runs())) data = make_check_data(graph, batch);
  if (!check_data.empty()) {
    save_check_data(*data, graph, check_data);
    std::cout << "wrote " << check_data << " (" << batch << " random inputs and whittle's outputs)\n";
  }
  if (vm.count("verify")) {
    std::string found;
    try {
      found = ex.verify(out, data ? &*data : nullptr);
    } catch (const Error& e) {
      remove_file(out);  // a file that fails its check is not left behind
      throw Error(std::string(e.what()) + "; removed " + out);
    }
    std::cout << "verify: " << found << "\n";
  }
  return 0;
}

}  // namespace whittle::cli
