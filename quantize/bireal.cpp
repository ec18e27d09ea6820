// The bireal_shortcuts pass (Bi-Real Net, Liu et al. 2018): a real-valued shortcut around every
// convolution of a basic residual block, so that a binarized convolution's input reaches the next
// layer at full precision. Optionally the blocks' ReLUs become ReActNet's RPReLU (Liu et al. 2020).
//
// A basic block  x → conv1 → bn1 → act1 → conv2 → bn2 → add(·, s) → ...  (s = x or a projection
// of x) becomes  x → conv1 → bn1 → add(·, s) → act1 → conv2 → bn2 → add(·, h) → ...  where h is
// act1's output: conv1's shortcut is the block's own (identity or projection, at the same MACs),
// conv2's is h. No tensor changes (the function does: a pretrained model is fine-tuned after it);
// the block is recognized from the graph's structure, so every ResNet basic block (the CIFAR
// ResNets, ResNet-18/34) is rewritten. A model without one is an error.

#include <ATen/ATen.h>

#include <map>
#include <queue>
#include <set>

#include "core/error.h"
#include "graph/op_registry.h"
#include "graph/pass_registry.h"
#include "graph/select.h"
#include "quantize/binary.h"

namespace whittle::quantize {

namespace {

struct BirealOptions {
  /// Convolutions whose blocks are rewritten (graph/select.h patterns): a block is rewritten when
  /// both of its convolutions are selected; empty: every conv2d.
  std::vector<std::string> targets;
  /// Patterns excluded from targets.
  std::vector<std::string> ignore;
  /// What the blocks' activations become: keep (as they are) or rprelu.
  std::string activation = "keep";
  /// RPReLU's initial slope β (ReActNet: 0.25); its shifts start at 0.
  double rprelu_slope = 0.25;
};

const OptionsSchema<BirealOptions>& bireal_schema() {
  using O = BirealOptions;
  static const auto schema =
      OptionsSchema<O>()
          .add("targets", &O::targets,
               "convolutions whose basic blocks are rewritten, both of a block's (names, op kinds, re:<regex>)", {},
               "every conv2d")
          .add("ignore", &O::ignore, "patterns excluded from targets")
          .add("activation", &O::activation, "what the blocks' activations become: keep, or rprelu (ReActNet)",
               {"keep", "rprelu"})
          .add("rprelu_slope", &O::rprelu_slope, "RPReLU's initial slope for negative inputs (its shifts start at 0)");
  return schema;
}

// The single producer of `value` when it is of op `op` and `value` has no other user; else nullptr.
const Node* sole_producer(const Graph& g, const std::string& value, const std::set<std::string>& ops) {
  const ValueInfo& v = g.value(value);
  if (v.producer.empty() || g.is_output(value) || g.users(value).size() != 1) return nullptr;
  const Node& p = g.node(v.producer);
  return ops.count(p.op) ? &p : nullptr;
}

struct Block {
  std::string add;    // the block's add
  size_t shortcut;    // its input holding s
  std::string act1;   // the activation between the convolutions
  std::string y1;     // bn1's output
  std::string h;      // act1's output, conv2's input
};

// Nodes in an order where every input is defined first, keeping the given order where it can:
// `rank` ranks each node (lower first among those ready).
std::vector<Node> topological(std::vector<Node> nodes, const std::map<std::string, double>& rank) {
  std::map<std::string, std::string> producer;  // value → node
  for (const Node& n : nodes)
    for (const auto& o : n.outputs) producer[o] = n.name;
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < nodes.size(); ++i) at[nodes[i].name] = i;
  std::map<std::string, int> waiting;
  std::map<std::string, std::vector<std::string>> dependents;
  for (const Node& n : nodes) {
    std::set<std::string> deps;
    for (const auto& in : n.inputs)
      if (auto p = producer.find(in); p != producer.end()) deps.insert(p->second);
    waiting[n.name] = static_cast<int>(deps.size());
    for (const auto& d : deps) dependents[d].push_back(n.name);
  }
  using Item = std::pair<double, std::string>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
  for (const Node& n : nodes)
    if (waiting[n.name] == 0) ready.push({rank.at(n.name), n.name});
  std::vector<Node> out;
  while (!ready.empty()) {
    const std::string name = ready.top().second;
    ready.pop();
    out.push_back(std::move(nodes[at[name]]));
    for (const auto& d : dependents[name])
      if (--waiting[d] == 0) ready.push({rank.at(d), d});
  }
  if (out.size() != nodes.size()) throw Error("bireal_shortcuts: the rewritten graph has a cycle");
  return out;
}

std::string bireal_shortcuts(Graph& graph, const BirealOptions& o, const PassCall& call) {
  register_all();
  if (o.activation != "rprelu" && call.settings.contains("rprelu_slope"))
    throw Error(call.source.about("rprelu_slope") + ": applies with activation rprelu only", ErrorKind::kUsage);
  graph.infer_shapes();
  const std::vector<std::string> chosen_list = select_nodes(graph, o.targets, o.ignore);
  const std::set<std::string> chosen(chosen_list.begin(), chosen_list.end());
  const std::set<std::string> activations = {"relu", "rprelu"};
  std::vector<Block> blocks;
  for (const Node& add : graph.nodes()) {
    if (add.op != "add" || add.inputs.size() != 2) continue;
    for (size_t side = 0; side < 2; ++side) {
      const Node* bn2 = sole_producer(graph, add.inputs[side], {"batch_norm"});
      const Node* conv2 = bn2 ? sole_producer(graph, bn2->inputs[0], {"conv2d"}) : nullptr;
      if (!conv2 || !chosen.count(conv2->name)) continue;
      const std::string& h = conv2->inputs[0];
      const ValueInfo& hv = graph.value(h);
      if (hv.producer.empty()) continue;
      const Node& act1 = graph.node(hv.producer);
      if (!activations.count(act1.op) || graph.users(h).size() != 1 || graph.is_output(h)) continue;
      const Node* bn1 = sole_producer(graph, act1.inputs[0], {"batch_norm"});
      const Node* conv1 = bn1 ? sole_producer(graph, bn1->inputs[0], {"conv2d"}) : nullptr;
      if (!conv1 || !chosen.count(conv1->name)) continue;
      const std::string& s = add.inputs[1 - side];
      if (graph.value(s).shape != graph.value(act1.inputs[0]).shape || hv.shape != graph.value(add.inputs[side]).shape)
        continue;
      blocks.push_back({add.name, 1 - side, act1.name, act1.inputs[0], h});
      break;
    }
  }
  if (blocks.empty()) {
    // Why not: rewritten already, ReLUs already quantizers, or no such block (among the targets).
    bool rewritten = false, quantized = false;
    for (const Node& n : graph.nodes()) {
      rewritten = rewritten || n.name.find(".bireal_add") != std::string::npos;
      quantized = quantized || n.op == "act_quant";
    }
    std::string why = "no basic residual block (conv → BN → ReLU or RPReLU → conv → BN → add)";
    if (!o.targets.empty() || !o.ignore.empty()) why += " with both of its convolutions selected by targets and ignore";
    if (rewritten) why += "; the model was rewritten by bireal_shortcuts already (it has its .bireal_add nodes)";
    if (quantized) why += "; its activations are quantized (act_quant nodes): run the pass before quantizing";
    throw Error("bireal_shortcuts: the model has " + why, ErrorKind::kUsage);
  }

  std::vector<Node> nodes = graph.nodes();
  std::map<std::string, double> rank;
  for (size_t i = 0; i < nodes.size(); ++i) rank[nodes[i].name] = static_cast<double>(i);
  std::set<std::string> taken;
  for (const Node& n : nodes) taken.insert(n.name);
  auto find = [&](const std::string& name) -> Node& {
    for (Node& n : nodes)
      if (n.name == name) return n;
    throw Error("bireal_shortcuts: lost node '" + name + "'");
  };
  std::string text;
  for (const Block& b : blocks) {
    Node& add = find(b.add);
    const std::string s = add.inputs[b.shortcut];
    std::string name = b.act1 + ".bireal_add";
    for (int k = 1; taken.count(name) || graph.has_value(name); ++k) name = b.act1 + ".bireal_add_" + std::to_string(k);
    taken.insert(name);
    Node add1 = make_node(name, "add", {b.y1, s}, {});
    add1.outputs = {name};
    rank[name] = rank[b.act1] - 0.5;
    find(b.act1).inputs[0] = name;
    add.inputs[b.shortcut] = b.h;
    nodes.push_back(add1);
    text += "shortcut around each convolution of the block ending in " + b.add + " (" + name + ")\n";
  }
  if (o.activation == "rprelu") {
    // The blocks' activations: act1, and the one reading each block's add when it is a ReLU.
    std::set<std::string> acts;
    for (const Block& b : blocks) {
      acts.insert(b.act1);
      for (const auto& u : graph.users(b.add))
        if (graph.node(u).op == "relu") acts.insert(u);
    }
    for (const auto& name : acts) {
      Node& n = find(name);
      if (n.op != "relu") continue;
      const int64_t c = graph.value(name).shape.at(1);  // a ReLU's output has its input's channels
      // On the device and in the dtype of the model's tensors (the block's convolution weights).
      at::TensorOptions f = at::TensorOptions().dtype(at::kFloat);
      for (const Node& m : graph.nodes())
        if (const at::Tensor* w = m.params.find("weight"); m.op == "conv2d" && w && w->defined()) {
          f = f.device(w->device()).dtype(w->scalar_type());
          break;
        }
      n.op = "rprelu";
      n.attrs.clear();
      n.params.set("shift_in", at::zeros({c}, f).set_requires_grad(true));
      n.params.set("slope", at::full({c}, o.rprelu_slope, f).set_requires_grad(true));
      n.params.set("shift_out", at::zeros({c}, f).set_requires_grad(true));
      text += name + " → rprelu\n";
    }
  }
  Graph out;
  for (const auto& in : graph.inputs()) out.add_input(in, graph.value(in).shape);
  for (Node& n : topological(std::move(nodes), rank)) {
    const int count = static_cast<int>(n.outputs.size());
    n.outputs.clear();
    out.add_node(std::move(n), count);
  }
  out.set_outputs(graph.outputs());
  out.validate();
  graph = std::move(out);
  return text;
}

}  // namespace

void register_bireal_pass() {
  register_pass(make_pass("bireal_shortcuts", "quantize",
                          "Bi-Real Net (Liu et al. 2018): a real-valued shortcut around every convolution of a basic "
                          "residual block; optionally its ReLUs become ReActNet's RPReLU",
                          bireal_schema(), [](Graph& g, const BirealOptions& o, const PassCall& call) {
                            return bireal_shortcuts(g, o, call);
                          }));
}

}  // namespace whittle::quantize
