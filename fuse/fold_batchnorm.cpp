#include "fuse/fold_batchnorm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "fuse/detail.h"
#include "fuse/fold_math.h"
#include "core/error.h"

namespace whittle::fuse {

namespace {

struct Match {
  std::string layer;
  std::string bn;
};

// Why the BN node cannot fold into the layer before it ("" when it can); sets *layer.
std::string qualify(const Graph& graph, const Node& bn, std::string* layer, bool need_plain_weight) {
  std::string why = detail::layer_bn_problem(graph, bn, layer);
  if (why.empty() && need_plain_weight) why = detail::plain_weight_problem(graph.node(*layer));
  return why;
}

template <typename Rewrite>
Report for_each_pair(Graph& graph, const FoldOptions& options, const char* pass, bool need_plain_weight, Rewrite rewrite) {
  Report report;
  report.pass = pass;
  const std::set<std::string> chosen = detail::selection(graph, options.targets, options.ignore);
  // Collect first, then rewrite in graph order: each BN folds into its own producer, so one
  // rewrite never changes another match.
  std::vector<Match> matches;
  for (const Node& n : graph.nodes()) {
    if (n.op != "batch_norm" || !chosen.count(n.name)) continue;
    std::string layer;
    std::string why = qualify(graph, n, &layer, need_plain_weight);
    if (!why.empty()) {
      report.skipped.push_back(n.name + ": " + why);
      continue;
    }
    matches.push_back({layer, n.name});
  }
  for (const Match& m : matches) rewrite(graph, m, report);
  graph.validate();
  return report;
}

}  // namespace

Report fold_batchnorm(Graph& graph, const FoldOptions& options) {
  return for_each_pair(graph, options, "fold_batchnorm", true, [](Graph& g, const Match& m, Report& report) {
    Node& layer = g.node(m.layer);
    const Node& bn = g.node(m.bn);
    ConvBnParams p;
    p.weight = layer.params.at("weight");
    if (const at::Tensor* b = layer.params.find("bias"); b && b->defined()) p.bias = *b;
    p.bn = detail::bn_params(bn);
    p.layout = detail::layout_of(layer.op);
    p.groups = channel_groups(layer);
    FoldedParams f = fold_conv_bn_params(p);
    const at::Tensor like_bias = p.bias.defined() ? p.bias : p.weight;
    layer.params.set("weight", detail::as_parameter(f.weight, p.weight));
    layer.params.set("bias", detail::as_parameter(f.bias, like_bias));
    const std::string bn_out = bn.outputs.at(0), layer_out = layer.outputs.at(0), bn_name = bn.name;
    g.replace_all_uses(bn_out, layer_out);
    g.remove_node(bn_name);
    report.fused.push_back(m.layer + " ← " + bn_name);
  });
}

Report fold_batchnorm(GraphModule& module, const FoldOptions& options) {
  return run_on_module(module, "fold_batchnorm", ModuleMode::kEval, [&](Graph& g) { return fold_batchnorm(g, options); });
}

Report remove_bias_before_batchnorm(Graph& graph, const FoldOptions& options) {
  Report report = for_each_pair(graph, options, "remove_bias_before_batchnorm", false, [](Graph& g, const Match& m, Report& r) {
    Node& layer = g.node(m.layer);
    const at::Tensor* b = layer.params.find("bias");
    if (!b || !b->defined()) return;
    Node& bn = g.node(m.bn);
    at::NoGradGuard no_grad;
    at::Tensor mean = bn.buffers.at("running_mean");
    bn.buffers.set("running_mean", (mean.to(at::kDouble) - b->detach().to(at::kDouble)).to(mean.scalar_type()));
    layer.params.erase("bias");
    r.fused.push_back(m.layer + ".bias → " + m.bn + ".running_mean");
  });
  return report;
}

}  // namespace whittle::fuse
