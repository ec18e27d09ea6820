#include "fuse/qat_batchnorm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "fuse/detail.h"
#include "fuse/fold_math.h"
#include "fuse/fuse.h"
#include "core/error.h"
#include "graph/functional.h"
#include "graph/op_registry.h"

namespace whittle::fuse {

namespace {

constexpr const char* kOp = "conv_bn_qat";

[[noreturn]] void node_fail(const Node& n, const std::string& msg) { throw Error("node '" + n.name + "' (" + n.op + "): " + msg); }

const at::Tensor* find_defined(const NamedTensors& ts, const std::string& name) {
  const at::Tensor* t = ts.find(name);
  return t && t->defined() ? t : nullptr;
}

// The layer + BN tensors of a conv_bn_qat node, with `weight` as the layer weight.
ConvBnParams qat_params(const Node& n, const at::Tensor& weight) {
  ConvBnParams p;
  p.weight = weight;
  if (const at::Tensor* b = find_defined(n.params, "bias")) p.bias = *b;
  p.bn = detail::bn_params(n, "bn_");
  p.layout = detail::layout_of(n.attr_str("base_op"));
  p.groups = channel_groups(n);
  return p;
}

// A node of the base op with `weight` and, when `with_bias`, the layer's bias.
Node base_node(const Node& n, const at::Tensor& weight, bool with_bias) {
  Node b;
  b.name = n.name;
  b.op = n.attr_str("base_op");
  b.inputs = n.inputs;
  b.outputs = n.outputs;
  b.attrs = n.attrs;
  b.params.set("weight", weight);
  if (with_bias)
    if (const at::Tensor* bias = find_defined(n.params, "bias")) b.params.set("bias", *bias);
  return b;
}

// Channel-vector view for an output [N, C, ...].
at::Tensor channel_view(const at::Tensor& v, int64_t dim) {
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[1] = v.size(0);
  return v.reshape(shape);
}

std::vector<at::Tensor> qat_forward(const Node& n, const std::vector<at::Tensor>& in, bool training) {
  // `weight` here is already the folded (and quantized) weight: GraphModule ran the bn_fold transform.
  const at::Tensor& wf = n.params.at("weight");
  const OpTraits& base = op_traits(n.attr_str("base_op"));
  const bool frozen = n.attr_bool("bn_frozen");
  if (!training || frozen) {
    FoldedParams f = fold_conv_bn_params_differentiable(qat_params(n, wf));
    Node b = base_node(n, wf, false);
    b.params.set("bias", f.bias);
    return base.forward(b, in, false);
  }
  at::Tensor z = base.forward(base_node(n, wf, false), in, false).at(0);
  at::Tensor s = bn_scale(detail::bn_params(n, "bn_"));
  at::Tensor safe = at::where(s == 0, at::ones_like(s), s);
  z = z / channel_view(safe.to(z.scalar_type()), z.dim());
  if (const at::Tensor* b = find_defined(n.params, "bias")) z = z + channel_view(*b, z.dim());
  auto param = [&](const char* name) {
    const at::Tensor* t = find_defined(n.params, name);
    return t ? *t : at::Tensor();
  };
  return {batch_norm_forward(z, param("bn_weight"), param("bn_bias"), n.buffers.at("bn_running_mean"),
                             n.buffers.at("bn_running_var"), find_defined(n.buffers, "bn_num_batches_tracked"), true,
                             n.attr_float("bn_momentum"), n.attr_float("bn_eps"))};
}

void move_tensor(NamedTensors& from, const std::string& name, NamedTensors& to, const std::string& as) {
  if (const at::Tensor* t = from.find(name); t && t->defined()) to.set(as, *t);
}

}  // namespace

namespace detail {

// Registers the conv_bn_qat op and the bn_fold weight transform (called once by register_all).
void register_qat() {
  OpTraits t;
  t.kind = kOp;
  t.description = "QAT BN folding: conv2d/conv_transpose2d/linear + BN with the folded weight (Jacob et al. 2018)";
  t.channel_flow = ChannelFlow::kProducerConsumer;
  t.required_params = {"weight"};
  t.optional_params = {"bias", "bn_weight", "bn_bias"};
  t.norm_params = {"bn_weight", "bn_bias"};
  t.norm_scale = "bn_weight";
  t.attributes = {
      AttrSpec::needed("base_op", AttrType::kString, "the layer the BN folds into")
          .checked([](const Node&, const Attr& v) -> std::string {
            return is_foldable_layer(std::get<std::string>(v)) ? "" : "is " + attr_str(v) + ", not conv2d, conv_transpose2d or linear";
          }),
      AttrSpec::number("bn_eps", 1e-5, "the BN's eps").range(0, std::nullopt),
      AttrSpec::number("bn_momentum", 0.1, "the BN's momentum; below 0: cumulative average").range(std::nullopt, 1),
      AttrSpec::boolean("bn_frozen", false, "running statistics frozen: the folded eval form in training too")};
  // The base layer's own attributes (stride, groups, ...).
  t.node_attributes = [](const Node& n) -> const std::vector<AttrSpec>* {
    const auto it = n.attrs.find("base_op");
    if (it == n.attrs.end() || !std::holds_alternative<std::string>(it->second)) return nullptr;
    const OpTraits* base = op_registry().find(std::get<std::string>(it->second));
    return base ? &base->attributes : nullptr;
  };
  t.required_buffers = {"bn_running_mean", "bn_running_var"};
  // The base layer's channel tensors, and the BN's on the output channels.
  t.channel_tensors = [](const Node& n) {
    Node base;
    base.op = n.attr_str("base_op");
    std::vector<ChannelTensor> c = has_op(base.op) ? whittle::channel_tensors(base) : std::vector<ChannelTensor>{};
    for (const char* p : {"bn_weight", "bn_bias"}) c.push_back({p, false, ChannelRole::kOutput, 0, false});
    for (const char* b : {"bn_running_mean", "bn_running_var"}) c.push_back({b, true, ChannelRole::kOutput, 0, false});
    return c;
  };
  // The base layer's channel axis (a linear base: the last).
  t.channel_axis = [](const Node& n, const Shape& shape) {
    Node base;
    base.name = n.name;
    base.op = n.attr_str("base_op");
    return whittle::channel_axis(base, shape);
  };
  t.forward = qat_forward;
  t.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    if (!n.has_attr("base_op") || !is_foldable_layer(n.attr_str("base_op")))
      node_fail(n, "attribute 'base_op' must be conv2d, conv_transpose2d or linear");
    std::vector<Shape> out = op_traits(n.attr_str("base_op")).infer_shapes(base_node(n, n.params.at("weight"), true), in);
    const int64_t c = out.at(0).size() > 1 ? out[0][1] : 0;
    for (const char* name : {"bn_weight", "bn_bias"})
      if (const at::Tensor* p = find_defined(n.params, name); p && (p->dim() != 1 || p->size(0) != c))
        node_fail(n, std::string(name) + " has shape " + shape_str(p->sizes().vec()) + ", expected [" + std::to_string(c) + "]");
    for (const char* name : {"bn_running_mean", "bn_running_var"})
      if (const at::Tensor* p = find_defined(n.buffers, name); p && (p->dim() != 1 || p->size(0) != c))
        node_fail(n, std::string(name) + " has shape " + shape_str(p->sizes().vec()) + ", expected [" + std::to_string(c) + "]");
    return out;
  };
  t.macs = [](const Node& n, const std::vector<Shape>& in, const std::vector<Shape>& out) {
    const OpTraits& base = op_traits(n.attr_str("base_op"));
    return base.macs ? base.macs(base_node(n, n.params.at("weight"), false), in, out) : int64_t{0};
  };
  register_op(std::move(t));

  WeightTransform fold;
  fold.name = "bn_fold";
  fold.description = "QAT BN folding: W·γ/σ_running (the quantizer after it in the stack sees the folded weight)";
  fold.kind = TransformKind::kFold;
  fold.apply = [](const Node& n, const at::Tensor& w, bool) {
    if (!w.defined() || !w.is_floating_point()) node_fail(n, "bn_fold needs a float 'weight' parameter");
    ConvBnParams p = qat_params(n, w);
    return scale_output_channels(w, bn_scale(p.bn), p.layout, p.groups);
  };
  register_weight_transform(std::move(fold));
}

}  // namespace detail

Report prepare_qat_batchnorm(Graph& graph, const QatOptions& options) {
  register_all();
  Report report;
  report.pass = "qat_batchnorm";
  const std::set<std::string> chosen = detail::selection(graph, options.targets, options.ignore);
  std::vector<std::pair<std::string, std::string>> matches;  // (layer, bn)
  for (const Node& n : graph.nodes()) {
    if (n.op != "batch_norm" || !chosen.count(n.name)) continue;
    std::string layer;
    std::string why = detail::layer_bn_problem(graph, n, &layer);
    if (why.empty()) {
      const Node& l = graph.node(layer);
      const at::Tensor* w = find_defined(l.params, "weight");
      if (!w || !w->is_floating_point()) why = "'" + layer + "' has no float weight (packed or missing)";
      else if (has_weight_transform(l, "bn_fold")) why = "'" + layer + "' is already folded";
      else if (find_transform_kind(l, TransformKind::kDecode) >= 0) why = "'" + layer + "' holds packed codes";
    }
    if (!why.empty()) {
      report.skipped.push_back(n.name + ": " + why);
      continue;
    }
    matches.emplace_back(layer, n.name);
  }
  for (const auto& [layer_name, bn_name] : matches) {
    Node& l = graph.node(layer_name);
    Node& bn = graph.node(bn_name);
    // bn_fold goes in front of the quantizer (or at the end of a stack without one).
    const int64_t q = find_transform_kind(l, TransformKind::kQuantizer);
    const size_t fold_at = q >= 0 ? static_cast<size_t>(q) : l.weight_transforms.size();
    at::Tensor unfolded;
    {
      at::NoGradGuard no_grad;
      unfolded = transformed_weight(l, false, fold_at);
    }
    l.attrs["base_op"] = l.op;
    l.op = kOp;
    push_weight_transform(l, "bn_fold", q);
    l.attrs["bn_eps"] = bn.attr_float("eps");
    l.attrs["bn_momentum"] = bn.attr_float("momentum");
    l.attrs["bn_frozen"] = int64_t{0};
    move_tensor(bn.params, "weight", l.params, "bn_weight");
    move_tensor(bn.params, "bias", l.params, "bn_bias");
    move_tensor(bn.buffers, "running_mean", l.buffers, "bn_running_mean");
    move_tensor(bn.buffers, "running_var", l.buffers, "bn_running_var");
    move_tensor(bn.buffers, "num_batches_tracked", l.buffers, "bn_num_batches_tracked");
    // The stage after it (the quantizer) reads W·γ/σ now: state it set from W adapts (LSQ's steps).
    if (fold_at + 1 < l.weight_transforms.size())
      if (const WeightTransform& t = weight_transform(l.weight_transforms[fold_at + 1]); t.input_changed) {
        at::NoGradGuard no_grad;
        t.input_changed(l, unfolded, transformed_weight(l, false, fold_at + 1));
      }
    const std::string bn_out = bn.outputs.at(0), layer_out = l.outputs.at(0);
    graph.replace_all_uses(bn_out, layer_out);
    graph.remove_node(bn_name);
    report.fused.push_back(layer_name + " ← " + bn_name + " (QAT)");
  }
  graph.validate();
  return report;
}

Report prepare_qat_batchnorm(GraphModule& module, const QatOptions& options) {
  return run_on_module(module, "prepare_qat_batchnorm", ModuleMode::kAny,
                       [&](Graph& g) { return prepare_qat_batchnorm(g, options); });
}

int64_t freeze_qat_batchnorm(Graph& graph) {
  int64_t count = 0;
  for (Node& n : graph.nodes()) {
    if (n.op != kOp || n.attr_bool("bn_frozen")) continue;
    n.attrs["bn_frozen"] = int64_t{1};
    ++count;
  }
  return count;
}

Report finalize_qat_batchnorm(Graph& graph) {
  register_all();
  Report report;
  report.pass = "qat_batchnorm_finalize";
  for (Node& n : graph.nodes()) {
    if (n.op != kOp) continue;
    at::Tensor w = n.params.at("weight");
    FoldedParams f;
    {
      at::NoGradGuard no_grad;
      f = fold_conv_bn_params_differentiable(qat_params(n, w.detach()));
    }
    const at::Tensor* b = find_defined(n.params, "bias");
    const at::Tensor like_bias = b ? *b : w;
    n.op = n.attr_str("base_op");
    for (const char* key : {"base_op", "bn_eps", "bn_momentum", "bn_frozen"}) n.attrs.erase(key);
    erase_weight_transform(n, "bn_fold");
    n.params.set("weight", detail::as_parameter(f.weight, w));
    n.params.set("bias", detail::as_parameter(f.bias, like_bias));
    n.params.erase("bn_weight");
    n.params.erase("bn_bias");
    for (const char* key : {"bn_running_mean", "bn_running_var", "bn_num_batches_tracked"}) n.buffers.erase(key);
    report.fused.push_back(n.name + " (folded weight" +
                           (find_transform_kind(n, TransformKind::kQuantizer) >= 0
                                ? ", " + n.weight_transforms[static_cast<size_t>(find_transform_kind(n, TransformKind::kQuantizer))] + " quantizer"
                                : std::string()) +
                           ")");
  }
  graph.validate();
  return report;
}

Report finalize_qat_batchnorm(GraphModule& module) {
  return run_on_module(module, "finalize_qat_batchnorm", ModuleMode::kAny,
                       [](Graph& g) { return finalize_qat_batchnorm(g); });
}

}  // namespace whittle::fuse
