// `whittle export MODEL --format onnx|torchscript --out FILE`: a checkpoint, zoo model or imported
// TorchScript model written as ONNX or TorchScript in deploy form (docs/export.md).

#include <ATen/ATen.h>

#include <boost/program_options.hpp>

#include <iomanip>
#include <iostream>

#include "core/error.h"
#include "core/file_util.h"
#include "export/onnx.h"
#include "export/torchscript_export.h"
#include "export/verify.h"
#include "tools/command.h"
#include "tools/model_source.h"

namespace po = boost::program_options;

namespace whittle::cli {

int run_export(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle export MODEL --out FILE [--format onnx|torchscript] [--opset N] [--static-batch]\n"
      "                      [--verify] [--check-data FILE.h5] [--input-shape N,C,H,W]\n\n"
      "Writes MODEL (a whittle checkpoint, a TorchScript file or a zoo model name) as ONNX or as TorchScript,\n"
      "in deploy form: eval mode, QAT batch norms folded, quantized weights decoded (DoReFa grids of up to 7\n"
      "bits as QuantizeLinear/DequantizeLinear in ONNX), activation quantizers as plain ops. The format\n"
      "defaults from the extension of --out (.onnx; .pt, .ts, .torchscript). --verify loads a TorchScript\n"
      "export with torch::jit::load and compares its outputs on 4 random inputs with whittle's; for ONNX it\n"
      "re-reads the file and runs the ONNX checker (run outputs with onnxruntime, see docs/export.md).\n"
      "--check-data writes those random inputs and whittle's outputs (HDF5) for checks in other runtimes.\n\n"
      "examples:\n  whittle export runs/mnist/lenet5_dorefa_w4a4/model.h5 --out lenet5_w4a4.onnx\n"
      "  whittle export resnet20 --format torchscript --out resnet20.pt --verify\n\noptions");
  std::string model, out, format, shape_text, check_data;
  int64_t opset = 17;
  opts.add_options()("help,h", "this text")("out", po::value<std::string>(&out), "file to write")(
      "format", po::value<std::string>(&format), "onnx or torchscript (default: from the --out extension)")(
      "opset", po::value<int64_t>(&opset)->default_value(17), "ONNX opset, 13..17")(
      "static-batch", "ONNX: fix the batch dimension to the model's declared one (default: dynamic 'N')")(
      "verify", "check the written file (see above) and print the largest output difference")(
      "check-data", po::value<std::string>(&check_data), "also write random inputs and whittle's outputs for them (HDF5)")(
      "input-shape", po::value<std::string>(&shape_text), "input shape of a TorchScript file or zoo model (N,C,H,W)")(
      "num-classes", po::value<int64_t>()->default_value(10), "classes of a zoo model");
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
    const std::string ext = file_extension(out);
    if (ext == ".onnx") format = "onnx";
    else if (ext == ".pt" || ext == ".ts" || ext == ".torchscript") format = "torchscript";
    else
      throw Error("export: cannot tell the format from '" + out + "'; give --format onnx or --format torchscript",
                  ErrorKind::kUsage);
  }
  if (format != "onnx" && format != "torchscript")
    throw Error("export: unknown --format '" + format + "' (onnx, torchscript)", ErrorKind::kUsage);
  if (format != "onnx" && (!vm["opset"].defaulted() || vm.count("static-batch")))
    throw Error("export: --opset and --static-batch apply to --format onnx only", ErrorKind::kUsage);
  if (!check_data.empty() && (is_same_or_inside(check_data, out) || (path_exists(model) && is_same_or_inside(check_data, model))))
    throw Error("export: --check-data " + check_data + " must be another file than MODEL and --out", ErrorKind::kUsage);

  check_writable_file("export", out, "--out");
  if (!check_data.empty()) check_writable_file("export", check_data, "--check-data");

  std::optional<Shape> shape;
  if (!shape_text.empty()) shape = parse_shape(shape_text, "--input-shape");
  runner::ModelMetadata meta;
  const Graph graph =
      load_cli_model("export", model, shape, vm["num-classes"].as<int64_t>(), !vm["num-classes"].defaulted(), &meta);
  const bool static_batch = vm.count("static-batch") > 0;
  if (format == "onnx") {
    OnnxOptions o;
    o.opset = opset;
    o.dynamic_batch = !static_batch;
    o.metadata["source"] = model;
    export_onnx(graph, out, o);
    std::cout << "wrote " << out << " (ONNX, opset " << opset << ", " << file_size(out) << " bytes)\n";
  } else {
    export_torchscript(graph, out);
    std::cout << "wrote " << out << " (TorchScript, " << file_size(out) << " bytes)\n";
  }
  // Check data at the batch the file accepts: the declared one when it is fixed.
  const int64_t batch = static_batch && !graph.inputs().empty() ? graph.value(graph.inputs()[0]).shape.at(0) : 4;
  // Random inputs and whittle's outputs for them, computed once for --check-data and --verify.
  std::optional<CheckData> data;
  if (!check_data.empty() || (vm.count("verify") && format != "onnx")) data = make_check_data(graph, batch);
  if (!check_data.empty()) {
    save_check_data(*data, graph, check_data);
    std::cout << "wrote " << check_data << " (" << batch << " random inputs and whittle's outputs)\n";
  }
  if (vm.count("verify")) {
    if (format == "onnx") {
      const int64_t nodes = check_onnx_file(out);
      std::cout << "verify: " << out << " parses and passes the ONNX checker (" << nodes
                << " nodes); compare its outputs with onnxruntime (docs/export.md)\n";
    } else {
      ExportCheck c;
      try {
        c = verify_torchscript_file(*data, out);
      } catch (const Error& e) {
        remove_file(out);
        throw Error(std::string(e.what()) + "; removed " + out);
      }
      const double rel = c.max_abs_output > 0 ? c.max_abs_difference / c.max_abs_output : c.max_abs_difference;
      std::cout << "verify: torch::jit::load(" << out << ") on " << c.batch << " random inputs: largest difference "
                << std::setprecision(3) << c.max_abs_difference << " (" << rel << " of the largest output "
                << c.max_abs_output << ")" << (c.bitwise_equal ? ", bitwise equal" : "") << "\n";
      if (!(rel <= 1e-5)) {
        remove_file(out);  // a file that computes something else is not left behind
        throw Error("export: the TorchScript file's outputs differ from whittle's by " + std::to_string(rel) +
                    " of the largest output (bound 1e-5); removed " + out);
      }
    }
  }
  return 0;
}

}  // namespace whittle::cli
