#include "graph/op_registry.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>

#include "core/error.h"

namespace whittle {

void register_builtin_ops();  // ops.cpp

namespace {

std::map<std::string, OpTraits>& registry() {
  static std::map<std::string, OpTraits> ops;
  return ops;
}

std::map<std::string, OpTraits>& ensure_registry() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_ops(); });
  return registry();
}

}  // namespace

const char* channel_flow_name(ChannelFlow flow) {
  switch (flow) {
    case ChannelFlow::kProducerConsumer: return "producer_consumer";
    case ChannelFlow::kPassThrough: return "pass_through";
    case ChannelFlow::kElementwise: return "elementwise";
    case ChannelFlow::kConcat: return "concat";
    case ChannelFlow::kSplit: return "split";
    case ChannelFlow::kExpand: return "expand";
    case ChannelFlow::kOpaque: return "opaque";
  }
  return "?";
}

void register_op(OpTraits traits) {
  if (traits.kind.empty()) throw Error("register_op: empty op kind");
  if (!traits.forward || !traits.infer_shapes) throw Error("register_op: op '" + traits.kind + "' lacks forward or shape inference");
  // Built-ins first, so that a user's registration can replace one.
  auto& reg = ensure_registry();
  reg[traits.kind] = std::move(traits);
}

namespace detail {
// Used by ops.cpp during the one-time built-in registration (must not recurse into ensure_registry).
void register_builtin(OpTraits traits) { registry()[traits.kind] = std::move(traits); }
}  // namespace detail

bool has_op(const std::string& kind) { return ensure_registry().count(kind) != 0; }

OpTraits& mutable_op_traits(const std::string& kind) {
  auto& reg = ensure_registry();
  auto it = reg.find(kind);
  if (it == reg.end()) {
    std::string known;
    for (const auto& kv : reg) known += (known.empty() ? "" : ", ") + kv.first;
    throw Error("unknown op '" + kind + "' (known ops: " + known + ")");
  }
  return it->second;
}

const OpTraits& op_traits(const std::string& kind) { return mutable_op_traits(kind); }

std::vector<std::string> registered_ops() {
  std::vector<std::string> out;
  for (const auto& kv : ensure_registry()) out.push_back(kv.first);
  return out;
}

namespace {
std::map<std::string, WeightTransform>& transforms() {
  static std::map<std::string, WeightTransform> t;
  return t;
}
std::mutex& transforms_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

void register_weight_transform(WeightTransform transform) {
  if (transform.name.empty() || !transform.apply) throw Error("register_weight_transform: needs a name and a function");
  std::lock_guard<std::mutex> lock(transforms_mutex());
  transforms()[transform.name] = std::move(transform);
}

const WeightTransform& weight_transform(const std::string& name) {
  std::lock_guard<std::mutex> lock(transforms_mutex());
  auto it = transforms().find(name);
  if (it == transforms().end()) {
    std::string known;
    for (const auto& kv : transforms()) known += (known.empty() ? "" : ", ") + kv.first;
    throw Error("unknown weight transform '" + name + "' (known: " + (known.empty() ? "none registered" : known) + ")");
  }
  return it->second;
}

std::optional<Node> with_placeholder_weight(const Node& node) {
  if (node.params.contains("weight") || !node.has_attr("weight_transform") || !node.has_attr("weight_shape"))
    return std::nullopt;
  Node copy = node;
  copy.params.set("weight", at::empty(node.attr_ints("weight_shape"), at::TensorOptions().device(at::kMeta)));
  return copy;
}

NodeCost node_cost(const Graph& graph, const Node& node_in) {
  const std::optional<Node> stand_in = with_placeholder_weight(node_in);
  const Node& node = stand_in ? *stand_in : node_in;
  NodeCost c;
  for (const auto& kv : node.params)
    if (kv.second.defined()) c.params += kv.second.numel();
  const OpTraits& t = op_traits(node.op);
  if (t.macs) {
    std::vector<Shape> in, out;
    for (const auto& v : node.inputs) in.push_back(graph.value(v).shape);
    for (const auto& v : node.outputs) out.push_back(graph.value(v).shape);
    c.macs = t.macs(node, in, out);
  }
  return c;
}

NodeCost graph_cost(const Graph& graph) {
  NodeCost total;
  for (const auto& n : graph.nodes()) {
    NodeCost c = node_cost(graph, n);
    total.params += c.params;
    total.macs += c.macs;
  }
  return total;
}

}  // namespace whittle
