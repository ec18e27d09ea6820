#include "fuse/detail.h"

#include <ATen/ATen.h>

#include "graph/op_registry.h"
#include "graph/select.h"

namespace whittle::fuse::detail {

bool is_foldable_layer(const std::string& op) { return has_op(op) && op_traits(op).folds_batchnorm; }

WeightLayout layout_of(const std::string& op) {
  Node probe;
  probe.op = op;
  return weight_output_axis(probe).value_or(0) == 1 ? WeightLayout::kTransposed : WeightLayout::kOutputFirst;
}

BatchNormParams bn_params(const Node& node, const std::string& prefix) {
  BatchNormParams p;
  auto param = [&](const std::string& name) {
    const at::Tensor* t = node.params.find(prefix + name);
    return t ? *t : at::Tensor();
  };
  auto buffer = [&](const std::string& name) {
    const at::Tensor* t = node.buffers.find(prefix + name);
    return t ? *t : at::Tensor();
  };
  p.running_mean = buffer("running_mean");
  p.running_var = buffer("running_var");
  p.weight = param("weight");
  p.bias = param("bias");
  p.eps = node.attr_float(prefix + "eps");
  return p;
}

std::string sole_use_problem(const Graph& graph, const std::string& value, const std::string& consumer) {
  if (graph.is_output(value)) return "'" + value + "' is also a graph output";
  std::vector<std::string> users = graph.users(value);
  std::string others;
  for (const auto& u : users)
    if (u != consumer) others += (others.empty() ? "" : ", ") + u;
  if (!others.empty()) return "'" + value + "' has other users (" + others + ")";
  return "";
}

std::string plain_weight_problem(const Node& layer) {
  if (std::string why = transform_stack_problem(layer); !why.empty()) return why;
  const at::Tensor* w = layer.params.find("weight");
  if (!w || !w->defined()) return "'" + layer.name + "' has no weight tensor";
  if (!w->is_floating_point()) return "'" + layer.name + "' has a non-floating-point weight";
  const at::Tensor* b = layer.params.find("bias");
  if (b && b->defined() && !b->is_floating_point()) return "'" + layer.name + "' has a non-floating-point bias";
  return "";
}

std::string bn_tensor_problem(const Node& bn) {
  for (const char* name : {"running_mean", "running_var"}) {
    const at::Tensor* t = bn.buffers.find(name);
    if (!t || !t->defined()) return std::string("no ") + name + " (track_running_stats=False)";
    if (!t->is_floating_point()) return std::string(name) + " is not floating point";
  }
  for (const char* name : {"weight", "bias"}) {
    const at::Tensor* t = bn.params.find(name);
    if (t && t->defined() && !t->is_floating_point()) return std::string(name) + " is not floating point";
  }
  return "";
}

std::string layer_bn_problem(const Graph& graph, const Node& bn, std::string* layer) {
  const ValueInfo& in = graph.value(bn.inputs.at(0));
  if (in.producer.empty()) return "input '" + in.name + "' is a graph input, not a layer output";
  const Node& p = graph.node(in.producer);
  if (!is_foldable_layer(p.op)) return "input comes from " + p.op + " '" + p.name + "', not a conv2d/conv_transpose2d/linear";
  if (p.outputs.size() != 1) return "'" + p.name + "' has several outputs";
  if (std::string why = sole_use_problem(graph, in.name, bn.name); !why.empty()) return why;
  if (std::string why = bn_tensor_problem(bn); !why.empty()) return why;
  if (p.op == "linear" && in.shape.size() != 2)
    return "'" + p.name + "' output has shape " + shape_str(in.shape) + ": a BN over dim 1 does not normalize its features";
  *layer = p.name;
  return "";
}

std::set<std::string> selection(const Graph& graph, const std::vector<std::string>& targets,
                                const std::vector<std::string>& ignore) {
  std::vector<std::string> names = select_nodes(graph, targets, ignore);
  return {names.begin(), names.end()};
}

at::Tensor as_parameter(const at::Tensor& value, const at::Tensor& like) {
  at::Tensor t = value.detach().contiguous();
  if (like.defined() && like.requires_grad()) t.set_requires_grad(true);
  return t;
}

}  // namespace whittle::fuse::detail
