#include "fuse/bn_threshold.h"

#include <ATen/ATen.h>

#include "fuse/detail.h"
#include "fuse/fold_math.h"
#include "fuse/fuse.h"
#include "core/error.h"
#include "graph/op_registry.h"

namespace whittle::fuse {

namespace {

struct Match {
  std::string bn;
  std::string binarizer;
};

}  // namespace

Report fold_bn_into_threshold(Graph& graph, const ThresholdOptions& options) {
  register_all();
  Report report;
  report.pass = "bn_threshold";
  const std::set<std::string> chosen = detail::selection(graph, options.targets, options.ignore);
  std::vector<Match> matches;
  for (const Node& n : graph.nodes()) {
    if (!is_sign_binarizer(n) || n.inputs.size() != 1) continue;
    const ValueInfo& in = graph.value(n.inputs[0]);
    if (in.producer.empty()) continue;
    const Node& bn = graph.node(in.producer);
    if (bn.op != "batch_norm" || !chosen.count(bn.name)) continue;
    std::string why = detail::sole_use_problem(graph, in.name, n.name);
    if (why.empty()) why = detail::bn_tensor_problem(bn);
    if (!why.empty()) {
      report.skipped.push_back(bn.name + ": " + why);
      continue;
    }
    matches.push_back({bn.name, n.name});
  }
  for (const Match& m : matches) {
    const Node& bn = graph.node(m.bn);
    SignThreshold t = bn_sign_threshold(detail::bn_params(bn));
    const std::string y = bn.inputs.at(0);
    Node& q = graph.node(m.binarizer);
    q.op = "threshold_sign";
    q.attrs.clear();
    q.inputs = {y};
    q.buffers.set("threshold", t.threshold);
    q.buffers.set("direction", t.direction);
    graph.remove_node(m.bn);
    report.fused.push_back(m.binarizer + " ← " + m.bn + " + sign");
  }
  graph.validate();
  return report;
}

Report fold_bn_into_threshold(GraphModule& module, const ThresholdOptions& options) {
  return run_on_module(module, "fold_bn_into_threshold", ModuleMode::kEval, [&](Graph& g) { return fold_bn_into_threshold(g, options); });
}

}  // namespace whittle::fuse
