#include "runner/report.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <iomanip>
#include <ostream>
#include <sstream>

#include <algorithm>

#include "core/file_util.h"
#include "graph/op_registry.h"
#include "graph/version.h"
#include "quantize/method.h"

namespace whittle::runner {

namespace {

std::string model_label(const Recipe& r) { return r.model.name.empty() ? r.model.file : r.model.name; }

// A number in 4 significant digits, for the quantizer column.
std::string short_number(double v) {
  std::ostringstream os;
  os << std::setprecision(4) << v;
  return os.str();
}

// ", <name> <lo> to <hi>" for each learned parameter of `n` named in `params` (", <name> <v>" when
// all its values are one).
std::string param_ranges(const Node& n, const std::vector<std::string>& params) {
  std::string text;
  for (const auto& name : params) {
    const at::Tensor* p = n.params.find(name);
    if (!p || !p->defined() || p->numel() == 0) continue;
    const at::Tensor v = p->detach().to(at::kCPU, at::kDouble);
    const double lo = v.min().item<double>(), hi = v.max().item<double>();
    text += ", " + name + " " + short_number(lo) + (lo == hi ? "" : " to " + short_number(hi));
  }
  return text;
}

// LayerSummary::quantizer of `n`: its weight quantizer with the range of each learned parameter,
// or its activation quantizer's bits and the range of its grid (asked of the registries).
std::string quantizer_text(const Node& n) {
  if (n.op == "act_quant") {
    const quantize::ActivationQuantizer& q = quantize::activation_quantizer_of(n);
    const quantize::ActivationGrid g = q.grid(n);
    if (g.sign) return q.name + " ±1" + param_ranges(n, q.params);  // RSign: its thresholds' range
    if (g.bits >= 32) return q.name;
    if (g.affine) {  // codes a in [a_min, a_max] stand for (a − z)·step
      const double levels = static_cast<double>((int64_t{1} << g.bits) - 1), step = g.max / levels;
      const double a_min = g.signed_codes ? -(levels + 1) / 2 : 0.0;
      return q.name + " A" + std::to_string(g.bits) + (g.signed_codes ? " int" : " uint") + " on [" +
             short_number((a_min - static_cast<double>(g.zero_point)) * step) + ", " +
             short_number((a_min + levels - static_cast<double>(g.zero_point)) * step) + "], zero point " +
             std::to_string(g.zero_point);
    }
    return q.name + " A" + std::to_string(g.bits) + " on [" + short_number(g.offset) + ", " +
           short_number(g.offset + g.max) + "]";
  }
  if (n.weight_transforms.empty() || !quantize::weight_quantizers().contains(n.weight_transforms.back())) return "";
  const quantize::WeightQuantizer& q = quantize::weight_quantizers().get(n.weight_transforms.back());
  return q.name + param_ranges(n, q.params);
}

// Stored bits of a node's weight: the quantized width when a quantizer set `weight_bits`,
// otherwise the dtype's width.
int64_t weight_bits(const Node& n) {
  if (n.has_attr("weight_bits")) return n.attr_int("weight_bits");
  const at::Tensor* w = n.params.find("weight");
  return w && w->defined() ? static_cast<int64_t>(w->element_size()) * 8 : 0;
}

double tensor_bytes(const at::Tensor& t) { return static_cast<double>(t.numel() * static_cast<int64_t>(t.element_size())); }

// Elements of the float weight a packed node stands for (its `weight_shape`).
double packed_weight_count(const Node& n) {
  double count = 1;
  for (int64_t d : n.attr_ints("weight_shape")) count *= static_cast<double>(d);
  return count;
}

// Bytes of a node's tensors at stored precision: the weight at weight_bits, everything else at
// its dtype's size.
double stored_bytes(const Node& n) {
  double bytes = 0;
  for (const auto& kv : n.params) {
    if (!kv.second.defined()) continue;
    if (kv.first == "weight") bytes += static_cast<double>(kv.second.numel()) * static_cast<double>(weight_bits(n)) / 8.0;
    else bytes += tensor_bytes(kv.second);
  }
  for (const auto& kv : n.buffers)
    if (kv.second.defined()) bytes += tensor_bytes(kv.second);
  return bytes;
}

// The node's tensors as float32; a packed weight counts as the float32 weight it stands for, and
// its per-channel scale (part of that weight) not at all.
double fp32_bytes(const Node& n) {
  double bytes = 0;
  for (const auto& kv : n.params)
    if (kv.second.defined()) bytes += static_cast<double>(kv.second.numel()) * 4.0;
  for (const auto& kv : n.buffers) {
    if (!kv.second.defined()) continue;
    if (kv.first == "weight_codes" && n.has_attr("weight_shape")) bytes += 4.0 * packed_weight_count(n);
    else if (kv.first != "weight_scale" || !n.has_attr("weight_shape")) bytes += tensor_bytes(kv.second);
  }
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
    if (kv.first == "weight_codes" && n.has_attr("weight_shape"))
      bits += packed_weight_count(n) * static_cast<double>(n.attr_int("weight_bits"));
    else
      bits += 32.0 * static_cast<double>(kv.second.numel());
  }
  return bits / 8.0;
}

nlohmann::ordered_json summary_to_json(const ModelSummary& s) {
  nlohmann::ordered_json j;
  j["nodes"] = nlohmann::ordered_json::array();
  for (const LayerSummary& l : s.layers) {
    nlohmann::ordered_json r = {{"name", l.name},         {"op", l.op},     {"output_shape", l.output_shape},
                                {"params", l.params},     {"macs", l.macs}, {"weight_bits", l.weight_bits}};
    if (!l.quantizer.empty()) r["quantizer"] = l.quantizer;
    if (l.unpruned_channels >= 0) {
      r["channels"] = l.channels;
      r["unpruned_channels"] = l.unpruned_channels;
    }
    if (l.unpruned_params >= 0) {
      r["unpruned_params"] = l.unpruned_params;
      r["unpruned_macs"] = l.unpruned_macs;
    }
    j["nodes"].push_back(std::move(r));
  }
  j["total"] = {{"params", s.params},
                {"macs", s.macs},
                {"bytes", static_cast<int64_t>(s.bytes + 0.5)},
                {"fp32_bytes", static_cast<int64_t>(s.fp32_bytes + 0.5)},
                {"theoretical_bytes", static_cast<int64_t>(s.theoretical_bytes + 0.5)}};
  if (s.unpruned_params >= 0) {
    j["total"]["unpruned_params"] = s.unpruned_params;
    j["total"]["unpruned_macs"] = s.unpruned_macs;
  }
  return j;
}

}  // namespace

ModelSummary summarize_model(const Graph& g) {
  ModelSummary s;
  int64_t unpruned_params = 0, unpruned_macs = 0;
  bool pruned_costs = false;  // checkpoints pruned before per-node costs were recorded lack them
  for (const auto& n : g.nodes()) {
    const NodeCost c = node_cost(g, n);
    LayerSummary l;
    l.name = n.name;
    l.op = n.op;
    l.output_shape = g.value(n.outputs.front()).shape;
    l.params = c.params;
    l.macs = c.macs;
    l.weight_bits = weight_bits(n);
    l.quantizer = quantizer_text(n);
    if (n.has_attr("unpruned_channels")) {
      l.channels = l.output_shape.size() >= 2 ? l.output_shape[1] : 0;
      l.unpruned_channels = n.attr_int("unpruned_channels");
      s.pruned = true;
    }
    if (n.has_attr("unpruned_params")) {
      s.pruned = pruned_costs = true;
      if (n.attr_int("unpruned_params") != c.params || n.attr_int("unpruned_macs") != c.macs) {
        l.unpruned_params = n.attr_int("unpruned_params");
        l.unpruned_macs = n.attr_int("unpruned_macs");
      }
    }
    s.params += c.params;
    s.macs += c.macs;
    unpruned_params += n.has_attr("unpruned_params") ? n.attr_int("unpruned_params") : c.params;
    unpruned_macs += n.has_attr("unpruned_macs") ? n.attr_int("unpruned_macs") : c.macs;
    s.bytes += stored_bytes(n);
    s.fp32_bytes += fp32_bytes(n);
    s.theoretical_bytes += theoretical_bytes(n);
    s.layers.push_back(std::move(l));
  }
  if (pruned_costs) {
    s.unpruned_params = unpruned_params;
    s.unpruned_macs = unpruned_macs;
  }
  return s;
}

std::string model_summary_json(const ModelSummary& summary) { return summary_to_json(summary).dump(); }

void write_report(const std::string& path, const Recipe& r, const RunResult& result, const std::string& device,
                  const Graph& model) {
  nlohmann::ordered_json report;
  report["recipe"] = r.path;
  report["model"] = model_label(r);
  report["test_top1"] = result.test.top1;
  report["test_top5"] = result.test.top5;
  report["test_loss"] = result.test.loss;
  report["test_images"] = result.test.samples;
  report["epochs"] = result.epochs_done;
  report["params"] = result.params;
  report["macs_per_image"] = result.macs;
  report["checkpoint"] = result.checkpoint;
  report["checkpoint_bytes"] = result.checkpoint_bytes;
  report["wall_seconds"] = result.wall_seconds;
  report["train_images_per_second"] = result.train_images_per_second;
  if (!result.loss_terms.empty()) report["loss_terms"] = result.loss_terms;
  for (const auto& [format, path] : result.exports)
    report["exports"][format] = {{"path", path}, {"bytes", result.export_bytes.count(format) ? result.export_bytes.at(format) : 0}};
  report["device"] = device;
  if (result.world_size > 1)
    report["distributed"] = {{"world_size", result.world_size},
                             {"backend", result.distributed_backend},
                             {"global_batch_size", result.global_batch_size}};
  // Float results depend on these (docs/reproducibility.md).
  report["cpu_capability"] = cpu_capability();
  report["intra_op_threads"] = intra_op_threads();
  report["seed"] = r.training.seed;
  report["deterministic"] = r.training.deterministic;
  report["torch_version"] = torch_version();
  report["model_summary"] = summary_to_json(summarize_model(model));
  write_file_atomic(path, report.dump(2) + "\n");
}

void print_report(std::ostream& log, const Recipe& r, const RunResult& result, const std::string& report_path) {
  log << "\n"
      << "  result                 " << model_label(r) << "\n"
      << "  test top-1             " << std::fixed << std::setprecision(2) << 100 * result.test.top1 << " %\n"
      << "  test top-5             " << 100 * result.test.top5 << " %\n"
      << "  test loss              " << std::setprecision(4) << result.test.loss << "\n"
      << "  parameters             " << result.params << "\n"
      << "  MACs per image         " << result.macs << "\n"
      << "  checkpoint             " << result.checkpoint << " (" << result.checkpoint_bytes << " bytes)\n"
      ;
  for (const auto& [format, path] : result.exports)
    log << "  " << std::left << std::setw(23) << (format + " export") << std::right << path << " ("
        << (result.export_bytes.count(format) ? result.export_bytes.at(format) : 0) << " bytes)\n";
  log << "  wall time              " << std::setprecision(1) << result.wall_seconds << " s\n";
  if (result.epochs_done > 0)  // a run of 0 epochs (calibration only) trained nothing
    log << "  training speed         " << std::setprecision(0) << result.train_images_per_second << " images/s"
        << (result.world_size > 1 ? " (all " + std::to_string(result.world_size) + " ranks)" : std::string()) << "\n";
  if (result.world_size > 1)
    log << "  data parallel          " << result.world_size << " ranks (" << result.distributed_backend << "), "
        << result.global_batch_size << " images a step\n";
  for (const auto& [k, v] : result.loss_terms)
    log << "  " << std::left << std::setw(23) << k << std::right << std::setprecision(4) << v << " (last epoch's mean)\n";
  log
      << "  report                 " << report_path << "\n";
}

}  // namespace whittle::runner
