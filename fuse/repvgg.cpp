#include "fuse/repvgg.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "fuse/detail.h"
#include "fuse/fold_math.h"
#include "core/error.h"

namespace whittle::fuse {

namespace {

struct Branch {
  bool conv = false;    // a conv branch (else identity)
  std::string conv_node;
  std::string bn_node;  // "" when the branch has no BN
  std::string x;        // the value the branch reads
  std::string problem;  // why the branch cannot be merged ("" when it can)
};

struct Tree {
  std::string root;
  std::vector<std::string> adds;     // root first
  std::vector<std::string> leaves;   // values summed
  std::vector<std::string> readers;  // the add reading each leaf
};

bool is_add(const Node& n) { return n.op == "add" && n.inputs.size() == 2 && n.outputs.size() == 1; }

void expand(const Graph& g, const std::string& add, Tree* t) {
  t->adds.push_back(add);
  for (const std::string& v : g.node(add).inputs) {
    const ValueInfo& vi = g.value(v);
    if (!vi.producer.empty() && is_add(g.node(vi.producer)) && detail::sole_use_problem(g, v, add).empty()) {
      expand(g, vi.producer, t);
    } else {
      t->leaves.push_back(v);
      t->readers.push_back(add);
    }
  }
}

Branch classify(const Graph& g, const std::string& v, const std::string& reader) {
  Branch b;
  b.x = v;
  const ValueInfo& vi = g.value(v);
  if (vi.producer.empty()) return b;
  const Node& p = g.node(vi.producer);
  const bool sole = detail::sole_use_problem(g, v, reader).empty();
  if (p.op == "batch_norm" && sole) {
    const std::string u = p.inputs.at(0);
    const ValueInfo& ui = g.value(u);
    const Node* c = ui.producer.empty() ? nullptr : &g.node(ui.producer);
    b.bn_node = p.name;
    if (c && c->op == "conv2d") {
      b.conv = true;
      b.conv_node = c->name;
      b.x = c->inputs.at(0);
      b.problem = detail::sole_use_problem(g, u, p.name);
      if (b.problem.empty()) b.problem = detail::plain_weight_problem(*c);
    } else {
      b.x = u;
    }
    if (b.problem.empty()) {
      std::string why = detail::bn_tensor_problem(p);
      if (!why.empty()) b.problem = "'" + p.name + "': " + why;
    }
    return b;
  }
  if (p.op == "conv2d" && sole) {
    b.conv = true;
    b.conv_node = p.name;
    b.x = p.inputs.at(0);
    b.problem = detail::plain_weight_problem(p);
  }
  return b;
}

std::string common_prefix(const std::vector<std::string>& names) {
  std::vector<std::string> parts;
  bool first = true;
  for (const auto& name : names) {
    std::vector<std::string> p;
    size_t start = 0;
    while (true) {
      size_t dot = name.find('.', start);
      p.push_back(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    p.pop_back();  // the last component names the node itself
    if (first) {
      parts = p;
      first = false;
      continue;
    }
    size_t k = 0;
    while (k < parts.size() && k < p.size() && parts[k] == p[k]) ++k;
    parts.resize(k);
  }
  std::string out;
  for (const auto& s : parts) out += (out.empty() ? "" : ".") + s;
  return out;
}

// The merge of one qualifying tree.
struct Plan {
  Tree tree;
  std::vector<Branch> branches;
  std::vector<int64_t> stride;
  int64_t groups = 1, kh = 1, kw = 1, channels = 0;
};

// Whether the tree is a RepVGG block: "" (yes, *plan filled), "-" (not a candidate), or a reason.
std::string check(const Graph& g, const Tree& t, Plan* plan) {
  std::vector<Branch> branches;
  for (size_t i = 0; i < t.leaves.size(); ++i) branches.push_back(classify(g, t.leaves[i], t.readers[i]));
  const Branch* first_conv = nullptr;
  for (const auto& b : branches)
    if (b.conv && !first_conv) first_conv = &b;
  if (!first_conv || branches.size() < 2) return "-";
  for (const auto& b : branches)
    if (b.x != first_conv->x) return "-";  // branches read different values: a plain residual add
  for (const auto& b : branches)
    if (!b.problem.empty()) return b.problem;
  const Node& c0 = g.node(first_conv->conv_node);
  plan->stride = c0.attr_pair("stride");
  plan->groups = c0.attr_int("groups");
  plan->channels = c0.params.at("weight").size(0);
  const int64_t in_channels = g.value(first_conv->x).shape.at(1);
  bool identity = false;
  for (const auto& b : branches) {
    if (!b.conv) {
      identity = true;
      continue;
    }
    const Node& c = g.node(b.conv_node);
    const at::Tensor& w = c.params.at("weight");
    const std::string where = "'" + c.name + "' ";
    if (c.attr_pair("dilation") != std::vector<int64_t>{1, 1}) return where + "is dilated";
    if (w.size(2) % 2 == 0 || w.size(3) % 2 == 0) return where + "has an even kernel size";
    if (c.attr_pair("padding") != std::vector<int64_t>{(w.size(2) - 1) / 2, (w.size(3) - 1) / 2})
      return where + "padding is not (k−1)/2, so its output is not centred like the other branches'";
    if (c.attr_pair("stride") != plan->stride) return where + "stride differs from '" + c0.name + "'";
    if (c.attr_int("groups") != plan->groups) return where + "groups differ from '" + c0.name + "'";
    if (w.size(0) != plan->channels) return where + "output channels differ from '" + c0.name + "'";
    plan->kh = std::max(plan->kh, w.size(2));
    plan->kw = std::max(plan->kw, w.size(3));
  }
  if (identity && (plan->stride != std::vector<int64_t>{1, 1} || in_channels != plan->channels))
    return "identity branch beside a strided or channel-changing conv";
  plan->tree = t;
  plan->branches = std::move(branches);
  return "";
}

void find_plans(const Graph& g, const std::string& root, const std::set<std::string>& chosen, std::vector<Plan>* plans,
                Report* report) {
  Tree t;
  t.root = root;
  expand(g, root, &t);
  Plan plan;
  std::string why = chosen.count(root) ? check(g, t, &plan) : "-";
  if (why.empty()) {
    plans->push_back(std::move(plan));
    return;
  }
  if (why != "-") report->skipped.push_back(root + ": " + why);
  // The whole sum is not a block; an inner sum may still be one.
  for (size_t i = 1; i < t.adds.size(); ++i) {
    const Node& a = g.node(t.adds[i]);
    const std::string parent = g.users(a.outputs[0]).front();
    if (parent == root) find_plans(g, a.name, chosen, plans, report);
  }
}

void rewrite(Graph& g, const Plan& plan, Report* report) {
  const Node& c0 = g.node([&] {
    for (const auto& b : plan.branches)
      if (b.conv) return b.conv_node;
    return std::string();
  }());
  const at::Tensor like = c0.params.at("weight");
  const std::string x = plan.branches.front().x;
  auto dbl = at::TensorOptions().dtype(at::kDouble).device(like.device());
  std::vector<FoldedParams> parts;
  std::vector<std::string> names;
  for (const auto& b : plan.branches) {
    ConvBnParams p;
    if (b.conv) {
      const Node& c = g.node(b.conv_node);
      p.weight = c.params.at("weight").detach().to(at::kDouble);
      if (const at::Tensor* bias = c.params.find("bias"); bias && bias->defined()) p.bias = bias->detach().to(at::kDouble);
      names.push_back(c.name);
    } else {
      p.weight = identity_kernel(plan.channels, plan.groups, 1, 1, dbl);
    }
    if (!b.bn_node.empty()) {
      p.bn = detail::bn_params(g.node(b.bn_node));
      names.push_back(b.bn_node);
      parts.push_back(fold_conv_bn_params(p));
    } else {
      at::Tensor bias = p.bias.defined() ? p.bias : at::zeros({plan.channels}, dbl);
      parts.push_back({p.weight, bias});
    }
  }
  FoldedParams merged = merge_branches(parts, plan.kh, plan.kw);
  const std::string prefix = common_prefix(names);
  Node n;
  n.name = g.unique_name(prefix.empty() ? plan.tree.root + ".reparam" : prefix + ".rbr_reparam");
  n.op = "conv2d";
  n.inputs = {x};
  n.attrs["stride"] = plan.stride;
  n.attrs["padding"] = std::vector<int64_t>{(plan.kh - 1) / 2, (plan.kw - 1) / 2};
  if (plan.groups != 1) n.attrs["groups"] = plan.groups;
  n.params.set("weight", detail::as_parameter(merged.weight.to(like.scalar_type()), like));
  n.params.set("bias", detail::as_parameter(merged.bias.to(like.scalar_type()), like));
  const std::string root_out = g.node(plan.tree.root).outputs.at(0);
  const std::string out = g.insert_node_before(plan.tree.root, n);
  g.replace_all_uses(root_out, out);
  std::vector<std::string> doomed = plan.tree.adds;
  for (const auto& b : plan.branches) {
    if (!b.bn_node.empty()) doomed.push_back(b.bn_node);
    if (b.conv) doomed.push_back(b.conv_node);
  }
  std::sort(doomed.begin(), doomed.end(), [&](const std::string& a, const std::string& b) { return g.node_index(a) > g.node_index(b); });
  doomed.erase(std::unique(doomed.begin(), doomed.end()), doomed.end());
  std::string what;
  for (const auto& d : doomed) {
    g.remove_node(d);
  }
  for (const auto& b : plan.branches)
    what += (what.empty() ? "" : " + ") + (b.conv ? b.conv_node + (b.bn_node.empty() ? "" : "/" + b.bn_node)
                                                  : (b.bn_node.empty() ? std::string("identity") : b.bn_node));
  report->fused.push_back(n.name + " ← " + what);
}

}  // namespace

Report reparameterize_repvgg(Graph& graph, const RepvggOptions& options) {
  Report report;
  report.pass = "repvgg";
  const std::set<std::string> chosen = detail::selection(graph, options.targets, options.ignore);
  std::vector<Plan> plans;
  for (const Node& n : graph.nodes()) {
    if (!is_add(n)) continue;
    const std::string& v = n.outputs[0];
    std::vector<std::string> users = graph.users(v);
    const bool inner = users.size() == 1 && !graph.is_output(v) && is_add(graph.node(users[0]));
    if (inner) continue;  // part of a larger sum, handled from its root
    find_plans(graph, n.name, chosen, &plans, &report);
  }
  for (const Plan& p : plans) rewrite(graph, p, &report);
  graph.validate();
  return report;
}

Report reparameterize_repvgg(GraphModule& module, const RepvggOptions& options) {
  return run_on_module(module, "reparameterize_repvgg", ModuleMode::kEval, [&](Graph& g) { return reparameterize_repvgg(g, options); });
}

}  // namespace whittle::fuse
