// `whittle inspect MODEL`: a per-node table (name, op, output shape, parameters, MACs, weight bits)
// and totals; --json for machines.

#include <ATen/ATen.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <iomanip>
#include <algorithm>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "core/registry.h"
#include "deploy/lowering.h"
#include "fuse/fuse.h"
#include "graph/op_registry.h"
#include "graph/pass_registry.h"
#include "quantize/quantize.h"
#include "runner/report.h"
#include "export/writers.h"
#include "tools/command.h"
#include "tools/model_source.h"

namespace po = boost::program_options;

namespace whittle::cli {

namespace {

std::string human(double v, const char* unit) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  if (v >= 1e9) os << v / 1e9 << " G" << unit;
  else if (v >= 1e6) os << v / 1e6 << " M" << unit;
  else if (v >= 1e3) os << v / 1e3 << " k" << unit;
  else os << std::setprecision(0) << v << " " << unit;
  return os.str();
}

}  // namespace

int run_inspect(const std::vector<std::string>& args) {
  // Every registry is listed by a flag of its name (--ops, --methods, --exporters, ...).
  const std::vector<const RegistryBase*> registries = all_registries();
  std::string flags;
  for (const RegistryBase* r : registries) flags += (flags.empty() ? "--" : " | --") + r->plural();
  po::options_description opts(
      "usage: whittle inspect MODEL [--input-shape N,C,H,W] [--json]\n       whittle inspect " + flags + "\n\n"
      "MODEL is a zoo model name (" + join(zoo_model_names(), ", ") + "),\n"
      "a TorchScript file (.pt, needs --input-shape), or a whittle checkpoint (.h5).\n"
      "The other forms list an extension registry: what this build can run, quantize, export and schedule.\n\n"
      "example:\n  whittle inspect resnet20 --input-shape 1,3,32,32 --json\n  whittle inspect --methods\n\noptions");
  std::string model, shape_text;
  opts.add_options()("help,h", "this text")
      ("input-shape", po::value<std::string>(&shape_text), "example input shape, comma-separated (batch first)")
      ("num-classes", po::value<int64_t>()->default_value(10), "classes of a zoo model")
      ("json", "print JSON instead of the table")
      ("ops", "list the registered ops (kind, channel flow, forms: o ONNX, t TorchScript, k deploy kernels, description) and exit")
      ("passes", "list the registered graph passes (name, module, description, options) and exit")
      ("transforms", "list the registered weight transforms (name, kind, description) and exit");
  for (const RegistryBase* r : registries) {
    if (r->plural() == "ops" || r->plural() == "passes" || r->plural() == "transforms") continue;
    opts.add_options()(r->plural().c_str(), ("list the registered " + r->plural() + " and exit").c_str());
  }
  po::variables_map vm = parse_command_line(args, opts, {{"model", &model}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  // One listing at a time, and a listing takes no model or model options.
  std::vector<std::string> listings;
  for (const RegistryBase* r : registries)
    if (vm.count(r->plural())) listings.push_back("--" + r->plural());
  if (listings.size() > 1)
    throw Error("inspect: give one of " + join(listings, ", ") + " at a time", ErrorKind::kUsage);
  if (!listings.empty() && (!model.empty() || vm.count("json") || vm.count("input-shape") || !vm["num-classes"].defaulted()))
    throw Error("inspect: " + listings[0] + " lists a registry; it takes no MODEL, --json, --input-shape or --num-classes",
                ErrorKind::kUsage);
  for (const RegistryBase* r : registries) {
    if (r->plural() == "ops" || r->plural() == "passes" || r->plural() == "transforms" || !vm.count(r->plural())) continue;
    for (const auto& name : r->names()) std::cout << std::left << std::setw(24) << name << r->description(name) << "\n";
    return 0;
  }
  if (vm.count("passes")) {
    for (const auto& name : pass_names()) {
      const PassInfo& p = pass_info(name);
      std::cout << std::left << std::setw(24) << name << std::setw(10) << p.module << p.description << "\n";
      for (const KeySpec& o : p.options) {
        std::cout << "    " << std::setw(20) << o.name << " " << std::setw(16) << key_type_name(o.type) << "default "
                  << (o.default_text.empty() || o.default_text == "[]" ? "(none)" : o.default_text) << ": " << o.description;
        if (!o.choices.empty()) std::cout << " (" << join(o.choices, ", ") << ")";
        if (!o.range.text().empty()) std::cout << " (" << o.range.text() << ")";
        std::cout << "\n";
      }
    }
    return 0;
  }
  if (vm.count("transforms")) {
    const char* kinds[] = {"mask", "fold", "quantizer", "decode"};
    for (const auto& name : registered_weight_transforms()) {
      const WeightTransform& t = weight_transform(name);
      std::cout << std::left << std::setw(12) << name << std::setw(11) << kinds[static_cast<int>(t.kind)] << t.description
                << "\n";
    }
    return 0;
  }
  if (vm.count("ops")) {
    register_export_writers();
    deploy::register_all();
    std::cout << "# op                   channel flow       forms (o: ONNX, t: TorchScript, k: deploy kernels; conv_bn_qat: "
                 "exported as its folded layer)\n"
              << "#   attribute           declaration (type, default, valid values)   meaning\n";
    for (const auto& kind : registered_ops()) {
      const OpTraits& t = op_traits(kind);
      // Export forms: o = ONNX, t = TorchScript (docs/export.md); k = a bitpacked path in the
      // deploy runtime (docs/kernels.md).
      const std::string forms = std::string(onnx_forms().contains(kind) ? "o" : "-") +
                                (torchscript_forms().contains(kind) ? "t" : "-") +
                                (deploy::deploy_lowerings().contains(kind) ? "k" : "-");
      std::cout << std::left << std::setw(22) << kind << std::setw(19) << channel_flow_name(t.channel_flow)
                << std::setw(5) << forms << t.description << "\n";
      // Its attributes, indented: name, declaration, meaning.
      for (const AttrSpec& a : t.attributes)
        std::cout << "    " << std::setw(18) << a.name << std::setw(40) << a.summary() << " " << a.description << "\n";
    }
    return 0;
  }
  if (model.empty()) throw Error("inspect: missing MODEL (see whittle inspect --help)", ErrorKind::kUsage);

  std::optional<Shape> shape;
  if (vm.count("input-shape") && shape_text.empty()) throw Error("inspect: --input-shape is empty (e.g. 1,3,32,32)", ErrorKind::kUsage);
  if (!shape_text.empty()) shape = parse_shape(shape_text, "--input-shape");
  Graph g = load_cli_model("inspect", model, shape, vm["num-classes"].as<int64_t>(), !vm["num-classes"].defaulted());
  const int64_t file_bytes = is_regular_file(model) ? file_size(model) : -1;

  const runner::ModelSummary sum = runner::summarize_model(g);
  if (vm.count("json")) {
    nlohmann::ordered_json j;
    j["model"] = model;
    j["input_shape"] = g.value(g.inputs().front()).shape;
    const nlohmann::ordered_json body = nlohmann::ordered_json::parse(runner::model_summary_json(sum));
    j["nodes"] = body["nodes"];
    j["total"] = body["total"];
    if (file_bytes >= 0) j["total"]["file_bytes"] = file_bytes;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  size_t wname = 4, wop = 2, wquant = 9;
  for (const auto& l : sum.layers) {
    wname = std::max(wname, l.name.size());
    wop = std::max(wop, l.op.size());
    wquant = std::max(wquant, l.quantizer.size());
  }
  std::cout << std::left << std::setw(static_cast<int>(wname) + 2) << "name" << std::setw(static_cast<int>(wop) + 2) << "op"
            << std::setw(22) << "output shape" << std::right << std::setw(12) << "params" << std::setw(15) << "MACs"
            << std::setw(6) << "bits" << "  " << std::left << std::setw(sum.pruned ? static_cast<int>(wquant) : 0) << "quantizer"
            << (sum.pruned ? "  before pruning: channels, params, MACs" : "") << "\n";
  for (const auto& l : sum.layers) {
    std::cout << std::left << std::setw(static_cast<int>(wname) + 2) << l.name << std::setw(static_cast<int>(wop) + 2)
              << l.op << std::setw(22) << shape_str(l.output_shape) << std::right << std::setw(12) << l.params
              << std::setw(15) << l.macs << std::setw(6) << (l.weight_bits ? std::to_string(l.weight_bits) : "-");
    if (sum.pruned || !l.quantizer.empty())
      std::cout << "  " << std::left << std::setw(sum.pruned ? static_cast<int>(wquant) : 0) << l.quantizer << std::right;
    if (l.unpruned_channels >= 0 || l.unpruned_params >= 0) {
      std::cout << "  ";
      if (l.unpruned_channels >= 0) std::cout << l.channels << " of " << l.unpruned_channels << " channels";
      if (l.unpruned_params >= 0)
        std::cout << (l.unpruned_channels >= 0 ? ", " : "") << l.unpruned_params << " params, " << l.unpruned_macs
                  << " MACs";
    }
    std::cout << "\n";
  }
  auto percent = [](int64_t a, int64_t b) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << (b > 0 ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0) << " %";
    return os.str();
  };
  std::cout << "\n" << g.nodes().size() << " nodes, input " << shape_str(g.value(g.inputs().front()).shape) << "\n"
            << "parameters: " << sum.params << " (" << human(static_cast<double>(sum.params), "") << ")";
  if (sum.unpruned_params >= 0)
    std::cout << "; before pruning " << sum.unpruned_params << " (" << percent(sum.params, sum.unpruned_params) << " kept)";
  std::cout << "\n"
            << "MACs:       " << sum.macs << " (" << human(static_cast<double>(sum.macs), "MAC") << ")";
  if (sum.unpruned_macs >= 0)
    std::cout << "; before pruning " << sum.unpruned_macs << " (" << percent(sum.macs, sum.unpruned_macs) << " kept)";
  std::cout << "\n"
            << "size:       " << human(sum.bytes, "B") << " at stored precision (" << human(sum.fp32_bytes, "B")
            << " as float32)\n"
            << "theoretical: " << human(sum.theoretical_bytes, "B") << " (weight_bits per quantized weight, 32 bits per other value)\n";
  if (file_bytes >= 0)
    std::cout << "file:       " << human(static_cast<double>(file_bytes), "B") << " (" << file_bytes << " bytes, "
              << std::setprecision(2) << static_cast<double>(file_bytes) / std::max(sum.theoretical_bytes, 1.0) << "x theoretical)\n";
  return 0;
}

}  // namespace whittle::cli
