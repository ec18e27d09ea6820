#include "quantize/method.h"

#include "core/error.h"
#include "graph/op_registry.h"

namespace whittle::quantize {

Registry<WeightQuantizer>& weight_quantizers() {
  static Registry<WeightQuantizer> r("weight quantizer", "weight-quantizers",
                                     [](const WeightQuantizer& q) { return q.description; }, ErrorKind::kRuntime);
  return r;
}

Registry<ActivationQuantizer>& activation_quantizers() {
  static Registry<ActivationQuantizer> r("activation quantizer", "activation-quantizers",
                                         [](const ActivationQuantizer& q) { return q.description; }, ErrorKind::kRuntime);
  return r;
}

void QuantizerMethod::change_bits(Graph&, const std::vector<std::string>&, const Config&) const {
  throw Error("quantize: method '" + name() + "' cannot change the bit widths of layers it quantized (no progressive "
              "bit widths); give its entries disjoint targets",
              ErrorKind::kUsage);
}

Registry<QuantizerMethod>& quantizer_methods() {
  static Registry<QuantizerMethod> r("quantizer method", "methods", [](const QuantizerMethod& m) { return m.description(); });
  return r;
}

void register_weight_quantizer(WeightQuantizer q) {
  if (q.name.empty() || !q.forward || !q.encode)
    throw Error("register_weight_quantizer: '" + q.name + "' needs a name, a forward and an encode");
  WeightTransform t;
  t.name = q.name;
  t.description = q.description;
  t.kind = TransformKind::kQuantizer;
  t.attributes = q.attributes;
  t.params = q.params;
  t.input_changed = q.input_changed;
  auto forward = q.forward;
  const std::string name = q.name;
  t.apply = [forward, name](const Node& n, const at::Tensor& w, bool training) {
    // The input a quantizer stage receives: the latent float weight (or a mask's output).
    if (!w.defined() || !w.is_floating_point())
      node_fail(n, "weight transform '" + name + "' needs a float 'weight' parameter");
    return forward(n, w, training);
  };
  register_weight_transform(std::move(t));
  weight_quantizers().add(name, std::move(q));
}

void register_activation_quantizer(ActivationQuantizer q) {
  if (q.name.empty() || !q.check || !q.forward || !q.grid || !q.torchscript)
    throw Error("register_activation_quantizer: '" + q.name + "' needs a name, check, forward, grid and torchscript form");
  const std::string name = q.name;
  activation_quantizers().add(name, std::move(q));
}

const ActivationQuantizer& activation_quantizer_of(const Node& n) {
  // Graphs written before every act_quant named its quantizer meant DoReFa's.
  const std::string method = n.attr_str("method");
  const ActivationQuantizer* q = activation_quantizers().find(method);
  if (!q) {
    std::string known;
    for (const auto& k : activation_quantizers().names()) known += (known.empty() ? "" : ", ") + k;
    node_fail(n, "unknown activation quantizer method '" + method + "' (" + known + ")");
  }
  return *q;
}

void register_quantizer_method(std::unique_ptr<QuantizerMethod> method) {
  if (!method) throw Error("register_quantizer_method: no method");
  const std::string name = method->name();
  quantizer_methods().add(name, std::move(method));
}

const QuantizerMethod& quantizer_method(const std::string& name) {
  if (const QuantizerMethod* m = quantizer_methods().find(name)) return *m;
  std::string known;
  for (const auto& k : quantizer_methods().names()) known += (known.empty() ? "" : ", ") + k;
  throw Error("quantize: unknown method '" + name + "' (" + known + ")", ErrorKind::kUsage);
}

void bad_bits(const std::string& method, const std::string& key, int64_t value, const std::string& allowed) {
  throw Error("quantize: " + key + " = " + std::to_string(value) + " is not supported by method '" + method + "' (" +
              allowed + ")",
              ErrorKind::kUsage);
}

std::optional<IntegerGrid> channel_grid(const EncodedWeight& e, const Shape& shape, double divisor) {
  if (e.axis < 0 || e.axis >= static_cast<int64_t>(shape.size())) return std::nullopt;
  const int64_t channels = shape[static_cast<size_t>(e.axis)];
  if (e.scale.numel() != 1 && e.scale.numel() != channels) return std::nullopt;
  at::Tensor scale = e.scale.detach().to(at::kCPU, at::kFloat).reshape({-1});
  if (divisor != 1.0) scale = (scale.to(at::kDouble) / divisor).to(at::kFloat);
  if (scale.numel() == 1) scale = scale.expand({channels});
  return IntegerGrid{scale.contiguous(), e.axis};
}

void node_fail(const Node& n, const std::string& msg) { throw Error("node '" + n.name + "' (" + n.op + "): " + msg); }

Node make_node(const std::string& name, const std::string& op, std::vector<std::string> inputs,
               std::map<std::string, Attr> attrs) {
  Node n;
  n.name = name;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  return n;
}

Granularity node_granularity(const Node& n) { return granularity_from_name(n.attr_str("granularity")); }

std::vector<AttrSpec> weight_quantizer_attributes(int64_t min_bits, int64_t max_bits) {
  return {AttrSpec::needed("weight_bits", AttrType::kInt, "bits per weight")
              .range(static_cast<double>(min_bits), static_cast<double>(max_bits)),
          AttrSpec::integer("weight_axis", 0, "the weight's output-channel axis (per-channel scales)").range(0, 7)};
}

AttrSpec granularity_attribute(Granularity fallback) {
  return AttrSpec::text("granularity", granularity_name(fallback), "where the weight's scale is computed")
      .one_of({"per_tensor", "per_channel"});
}

}  // namespace whittle::quantize
