#include "fuse/bn_threshold.h"

#include <ATen/ATen.h>

#include "fuse/detail.h"
#include "fuse/fold_math.h"
#include "fuse/fuse.h"
#include "core/error.h"
#include "graph/op_registry.h"

namespace whittle::fuse {

namespace {

// A binarizer's learned threshold [C] (OpTraits::sign_shift, RSign's); undefined for a plain sign.
at::Tensor sign_shift_of(const Node& n) {
  const OpTraits& t = op_traits(n.op);
  return t.sign_shift ? t.sign_shift(n) : at::Tensor();
}

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
    const Node* bn = in.producer.empty() ? nullptr : &graph.node(in.producer);
    if (bn && (bn->op != "batch_norm" || !chosen.count(bn->name))) bn = nullptr;
    std::string why;
    if (bn) {
      why = detail::sole_use_problem(graph, in.name, n.name);
      if (why.empty()) why = detail::bn_tensor_problem(*bn);
      if (!why.empty()) report.skipped.push_back(bn->name + ": " + why);
    }
    // A sign with a learned threshold (RSign) becomes a threshold_sign with or without a BN.
    if (bn && why.empty()) matches.push_back({bn->name, n.name});
    else if (sign_shift_of(n).defined()) matches.push_back({"", n.name});
  }
  for (const Match& m : matches) {
    Node& q = graph.node(m.binarizer);
    const at::Tensor shift = sign_shift_of(q);
    SignThreshold t;
    std::string y = q.inputs.at(0);
    if (!m.bn.empty()) {
      // sign(BN(y) − s) is the sign of a BN whose bias is β − s.
      const Node& bn = graph.node(m.bn);
      BatchNormParams p = detail::bn_params(bn);
      if (shift.defined()) {
        at::NoGradGuard no_grad;
        const at::Tensor beta = p.bias.defined() ? p.bias.detach().to(at::kDouble)
                                                 : at::zeros({shift.numel()}, p.running_mean.options().dtype(at::kDouble));
        p.bias = beta - shift.detach().to(beta.device(), at::kDouble);
      }
      t = bn_sign_threshold(p);
      y = bn.inputs.at(0);
    } else {
      // sign(y − s): +1 where y ≥ s.
      at::NoGradGuard no_grad;
      t.threshold = shift.detach().clone();
      t.direction = at::ones_like(t.threshold);
    }
    q.op = "threshold_sign";
    q.attrs.clear();
    q.params = NamedTensors();
    q.inputs = {y};
    q.buffers.set("threshold", t.threshold);
    q.buffers.set("direction", t.direction);
    if (!m.bn.empty()) graph.remove_node(m.bn);
    report.fused.push_back(m.binarizer + (m.bn.empty() ? " ← sign with its learned threshold" : " ← " + m.bn + " + sign"));
  }
  graph.validate();
  return report;
}

Report fold_bn_into_threshold(GraphModule& module, const ThresholdOptions& options) {
  return run_on_module(module, "fold_bn_into_threshold", ModuleMode::kEval, [&](Graph& g) { return fold_bn_into_threshold(g, options); });
}

}  // namespace whittle::fuse
