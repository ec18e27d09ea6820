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
#include "fuse/fuse.h"
#include "graph/op_registry.h"
#include "graph/pass_registry.h"
#include "quantize/quantize.h"
#include "export/writers.h"
#include "tools/command.h"
#include "tools/model_source.h"

namespace po = boost::program_options;

namespace whittle::cli {

namespace {

// Stored bits of a node's weight: the quantized width when a quantizer set `weight_bits`,
// otherwise the dtype's width.
int64_t weight_bits(const Node& n) {
  if (n.has_attr("weight_bits")) return n.attr_int("weight_bits");
  const at::Tensor* w = n.params.find("weight");
  return w && w->defined() ? static_cast<int64_t>(w->element_size()) * 8 : 0;
}

// Bytes of a node's tensors at stored precision: the weight at weight_bits, everything else at
// its dtype's size.
double stored_bytes(const Node& n) {
  double bytes = 0;
  for (const auto& kv : n.params) {
    if (!kv.second.defined()) continue;
    if (kv.first == "weight") bytes += static_cast<double>(kv.second.numel()) * static_cast<double>(weight_bits(n)) / 8.0;
    else bytes += static_cast<double>(kv.second.numel() * static_cast<int64_t>(kv.second.element_size()));
  }
  for (const auto& kv : n.buffers)
    if (kv.second.defined()) bytes += static_cast<double>(kv.second.numel() * static_cast<int64_t>(kv.second.element_size()));
  return bytes;
}

// Theoretical size of a node: `weight_bits` per quantized weight (latent or packed) plus 32 bits
// per other stored value (scales, biases, BN statistics, full-precision weights).
double theoretical_bytes(const Node& n) {
  const bool quantized = n.has_attr("weight_bits");
  double bits = 0;
  for (const auto& kv : n.params) {
    if (!kv.second.defined()) continue;
    const double count = static_cast<double>(kv.second.numel());
    bits += (quantized && kv.first == "weight" ? static_cast<double>(n.attr_int("weight_bits")) : 32.0) * count;
  }
  for (const auto& kv : n.buffers) {
    if (!kv.second.defined()) continue;
    if (kv.first == "weight_codes" && n.has_attr("weight_shape")) {
      double count = 1;
      for (int64_t d : n.attr_ints("weight_shape")) count *= static_cast<double>(d);
      bits += count * static_cast<double>(n.attr_int("weight_bits"));
    } else {
      bits += 32.0 * static_cast<double>(kv.second.numel());
    }
  }
  return bits / 8.0;
}

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
  po::options_description opts(
      "usage: whittle inspect MODEL [--input-shape N,C,H,W] [--json]\n       whittle inspect --ops | --passes | --transforms\n\n"
      "MODEL is a zoo model name (" + join(zoo_model_names(), ", ") + "),\n"
      "a TorchScript file (.pt, needs --input-shape), or a whittle checkpoint (.h5).\n\n"
      "example:\n  whittle inspect resnet20 --input-shape 1,3,32,32 --json\n\noptions");
  std::string model, shape_text;
  opts.add_options()("help,h", "this text")
      ("input-shape", po::value<std::string>(&shape_text), "example input shape, comma-separated (batch first)")
      ("num-classes", po::value<int64_t>()->default_value(10), "classes of a zoo model")
      ("json", "print JSON instead of the table")
      ("ops", "list the registered ops (kind, channel flow, export forms: o ONNX, t TorchScript, description) and exit")
      ("passes", "list the registered graph passes (name, module, description, options) and exit")
      ("transforms", "list the registered weight transforms (name, kind, description) and exit");
  po::variables_map vm = parse_command_line(args, opts, {{"model", &model}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (vm.count("passes")) {
    for (const auto& name : pass_names()) {
      const PassInfo& p = pass_info(name);
      std::cout << std::left << std::setw(24) << name << std::setw(10) << p.module << p.description << "\n";
      for (const auto& o : p.options)
        std::cout << "    " << std::setw(16) << o.name << std::setw(8) << o.type << "default "
                  << (o.default_value.empty() ? "(none)" : o.default_value) << ": " << o.description << "\n";
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
    std::cout << "# op                   channel flow       export (o: ONNX, t: TorchScript; conv_bn_qat: as its folded layer)\n";
    for (const auto& kind : registered_ops()) {
      const OpTraits& t = op_traits(kind);
      // Export forms: o = ONNX, t = TorchScript (docs/export.md).
      const std::string forms = std::string(t.to_onnx ? "o" : "-") + (t.to_torchscript ? "t" : "-");
      std::cout << std::left << std::setw(22) << kind << std::setw(19) << channel_flow_name(t.channel_flow)
                << std::setw(4) << forms << t.description << "\n";
    }
    return 0;
  }
  if (model.empty()) throw Error("inspect: missing MODEL (see whittle inspect --help)", ErrorKind::kUsage);

  std::optional<Shape> shape;
  if (vm.count("input-shape") && shape_text.empty()) throw Error("inspect: --input-shape is empty (e.g. 1,3,32,32)", ErrorKind::kUsage);
  if (!shape_text.empty()) shape = parse_shape(shape_text, "--input-shape");
  Graph g = runner::load_model(model_source(model, shape, vm["num-classes"].as<int64_t>()));
  const int64_t file_bytes = is_regular_file(model) ? file_size(model) : -1;

  nlohmann::ordered_json j;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  NodeCost total, unpruned;  // unpruned: each node's cost before pruning (its current one when not recorded)
  double total_bytes = 0, float_bytes = 0, theory_bytes = 0;
  for (const auto& n : g.nodes()) {
    theory_bytes += theoretical_bytes(n);
    NodeCost c = node_cost(g, n);
    total.params += c.params;
    total.macs += c.macs;
    unpruned.params += n.has_attr("unpruned_params") ? n.attr_int("unpruned_params") : c.params;
    unpruned.macs += n.has_attr("unpruned_macs") ? n.attr_int("unpruned_macs") : c.macs;
    double b = stored_bytes(n);
    total_bytes += b;
    for (const auto& kv : n.params)
      if (kv.second.defined()) float_bytes += static_cast<double>(kv.second.numel()) * 4.0;
    for (const auto& kv : n.buffers) {
      if (!kv.second.defined()) continue;
      if (kv.first == "weight_codes" && n.has_attr("weight_shape")) {  // packed: the float32 weight it stands for
        double count = 1;
        for (int64_t d : n.attr_ints("weight_shape")) count *= static_cast<double>(d);
        float_bytes += 4.0 * count;
      } else if (kv.first != "weight_scale" || !n.has_attr("weight_shape")) {
        float_bytes += static_cast<double>(kv.second.numel() * static_cast<int64_t>(kv.second.element_size()));
      }
    }
    rows.push_back({{"name", n.name},
                    {"op", n.op},
                    {"output_shape", g.value(n.outputs.front()).shape},
                    {"params", c.params},
                    {"macs", c.macs},
                    {"weight_bits", weight_bits(n)}});
    if (n.has_attr("unpruned_channels")) {
      const Shape& s = g.value(n.outputs.front()).shape;
      rows.back()["channels"] = s.size() >= 2 ? s[1] : 0;
      rows.back()["unpruned_channels"] = n.attr_int("unpruned_channels");
    }
    if (n.has_attr("unpruned_params") &&
        (n.attr_int("unpruned_params") != c.params || n.attr_int("unpruned_macs") != c.macs)) {
      rows.back()["unpruned_params"] = n.attr_int("unpruned_params");
      rows.back()["unpruned_macs"] = n.attr_int("unpruned_macs");
    }
  }
  const bool pruned = std::any_of(g.nodes().begin(), g.nodes().end(), [](const Node& n) {
    return n.has_attr("unpruned_channels") || n.has_attr("unpruned_params");
  });
  // Totals before pruning need the per-node costs, which checkpoints pruned before they were recorded lack.
  const bool pruned_costs = std::any_of(g.nodes().begin(), g.nodes().end(),
                                        [](const Node& n) { return n.has_attr("unpruned_params"); });
  if (vm.count("json")) {
    j["model"] = model;
    j["input_shape"] = g.value(g.inputs().front()).shape;
    j["nodes"] = rows;
    j["total"] = {{"params", total.params}, {"macs", total.macs}, {"bytes", static_cast<int64_t>(total_bytes + 0.5)},
                  {"fp32_bytes", static_cast<int64_t>(float_bytes + 0.5)},
                  {"theoretical_bytes", static_cast<int64_t>(theory_bytes + 0.5)}};
    if (file_bytes >= 0) j["total"]["file_bytes"] = file_bytes;
    if (pruned_costs) {
      j["total"]["unpruned_params"] = unpruned.params;
      j["total"]["unpruned_macs"] = unpruned.macs;
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  size_t wname = 4, wop = 2;
  for (const auto& n : g.nodes()) {
    wname = std::max(wname, n.name.size());
    wop = std::max(wop, n.op.size());
  }
  std::cout << std::left << std::setw(static_cast<int>(wname) + 2) << "name" << std::setw(static_cast<int>(wop) + 2) << "op"
            << std::setw(22) << "output shape" << std::right << std::setw(12) << "params" << std::setw(15) << "MACs"
            << std::setw(6) << "bits" << (pruned ? "  before pruning: channels, params, MACs" : "") << "\n";
  for (const auto& r : rows) {
    const int64_t bits = r["weight_bits"].get<int64_t>();
    std::cout << std::left << std::setw(static_cast<int>(wname) + 2) << r["name"].get<std::string>()
              << std::setw(static_cast<int>(wop) + 2) << r["op"].get<std::string>() << std::setw(22)
              << shape_str(r["output_shape"].get<Shape>()) << std::right << std::setw(12) << r["params"].get<int64_t>()
              << std::setw(15) << r["macs"].get<int64_t>() << std::setw(6) << (bits ? std::to_string(bits) : "-");
    if (r.contains("unpruned_channels") || r.contains("unpruned_params")) {
      std::cout << "  ";
      if (r.contains("unpruned_channels"))
        std::cout << r["channels"].get<int64_t>() << " of " << r["unpruned_channels"].get<int64_t>() << " channels";
      if (r.contains("unpruned_params"))
        std::cout << (r.contains("unpruned_channels") ? ", " : "") << r["unpruned_params"].get<int64_t>() << " params, "
                  << r["unpruned_macs"].get<int64_t>() << " MACs";
    }
    std::cout << "\n";
  }
  auto percent = [](int64_t a, int64_t b) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << (b > 0 ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0) << " %";
    return os.str();
  };
  std::cout << "\n" << g.nodes().size() << " nodes, input " << shape_str(g.value(g.inputs().front()).shape) << "\n"
            << "parameters: " << total.params << " (" << human(static_cast<double>(total.params), "") << ")";
  if (pruned_costs) std::cout << "; before pruning " << unpruned.params << " (" << percent(total.params, unpruned.params) << " kept)";
  std::cout << "\n"
            << "MACs:       " << total.macs << " (" << human(static_cast<double>(total.macs), "MAC") << ")";
  if (pruned_costs) std::cout << "; before pruning " << unpruned.macs << " (" << percent(total.macs, unpruned.macs) << " kept)";
  std::cout << "\n"
            << "size:       " << human(total_bytes, "B") << " at stored precision (" << human(float_bytes, "B")
            << " as float32)\n"
            << "theoretical: " << human(theory_bytes, "B") << " (weight_bits per quantized weight, 32 bits per other value)\n";
  if (file_bytes >= 0)
    std::cout << "file:       " << human(static_cast<double>(file_bytes), "B") << " (" << file_bytes << " bytes, "
              << std::setprecision(2) << static_cast<double>(file_bytes) / std::max(theory_bytes, 1.0) << "x theoretical)\n";
  return 0;
}

}  // namespace whittle::cli
