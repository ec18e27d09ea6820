#include "graph/op_registry.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/shape_limits.h"

namespace whittle {

void register_builtin_ops();  // ops.cpp

namespace {

// The registry without the built-ins: what the built-in registration itself writes to.
Registry<OpTraits>& raw_op_registry() {
  static Registry<OpTraits> r("op", "ops", [](const OpTraits& t) { return t.description; }, ErrorKind::kRuntime);
  return r;
}

Registry<WeightTransform>& raw_transforms() {
  static Registry<WeightTransform> r("weight transform", "transforms", [](const WeightTransform& t) { return t.description; },
                                     ErrorKind::kRuntime);
  return r;
}

// graph/'s own entries (the built-in ops and the mask transform), registered on first use of either
// registry, before any module's: a module's registration may replace or extend them.
void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_builtin_ops();
    register_mask_transform();
  });
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

Registry<OpTraits>& op_registry() {
  ensure_builtins();
  return raw_op_registry();
}

void register_op(OpTraits traits) {
  if (traits.kind.empty()) throw Error("register_op: empty op kind");
  if (!traits.forward || !traits.infer_shapes) throw Error("register_op: op '" + traits.kind + "' lacks forward or shape inference");
  // Built-ins first, so that a user's registration can replace one.
  const std::string kind = traits.kind;
  op_registry().add(kind, std::move(traits));
}

namespace detail {
// Used by ops.cpp during the one-time built-in registration (must not recurse into ensure_builtins).
void register_builtin(OpTraits traits) {
  const std::string kind = traits.kind;
  raw_op_registry().add(kind, std::move(traits));
}
Registry<OpTraits>& builtin_registry() { return raw_op_registry(); }
}  // namespace detail

bool has_op(const std::string& kind) { return op_registry().contains(kind); }

OpTraits& mutable_op_traits(const std::string& kind) { return op_registry().get_mutable(kind); }

const OpTraits& op_traits(const std::string& kind) { return op_registry().get(kind); }

std::vector<std::string> registered_ops() { return op_registry().names(); }

std::string op_for_torchscript(const std::string& qualified) {
  const Registry<OpTraits>& ops = op_registry();
  const std::vector<std::string> kinds = ops.names();
  auto find = [&](const std::string& name) -> std::string {
    for (const auto& kind : kinds)
      for (const auto& ts : ops.get(kind).torchscript_ops)
        if (ts == name) return kind;
    return "";
  };
  std::string op = find(qualified);
  if (op.empty() && qualified.size() > 1 && qualified.back() == '_' && qualified.rfind("__") != qualified.size() - 2)
    op = find(qualified.substr(0, qualified.size() - 1));
  return op;
}

const char* channel_role_name(ChannelRole role) {
  switch (role) {
    case ChannelRole::kOutput: return "output";
    case ChannelRole::kInput: return "input";
    case ChannelRole::kChannel: return "channel";
  }
  return "?";
}

std::vector<ChannelTensor> channel_tensors(const Node& node) {
  const OpTraits& t = op_traits(node.op);
  return t.channel_tensors ? t.channel_tensors(node) : std::vector<ChannelTensor>{};
}

std::optional<int64_t> weight_output_axis(const Node& node) {
  for (const ChannelTensor& c : channel_tensors(node))
    if (c.name == "weight" && !c.buffer && c.role == ChannelRole::kOutput) return c.axis;
  return std::nullopt;
}

bool is_weighted_layer(const Node& node) { return weight_output_axis(node).has_value(); }

bool folds_batchnorm(const Node& node) { return op_traits(node.op).folds_batchnorm; }

bool is_norm_param(const Node& node, const std::string& param) {
  const auto& names = op_traits(node.op).norm_params;
  return std::find(names.begin(), names.end(), param) != names.end();
}

const std::string& norm_scale_param(const Node& node) { return op_traits(node.op).norm_scale; }

bool is_sign_binarizer(const Node& node) {
  const OpTraits& t = op_traits(node.op);
  return t.binarizes && t.binarizes(node);
}

ParamRole param_role(const Node& node, const std::string& param) {
  const OpTraits& t = op_traits(node.op);
  for (const auto& name : node.weight_transforms) {
    const auto& owned = weight_transform(name).params;
    if (std::find(owned.begin(), owned.end(), param) != owned.end()) return ParamRole::kQuantizer;
  }
  if (t.quantizer_params) {
    const auto owned = t.quantizer_params(node);
    if (std::find(owned.begin(), owned.end(), param) != owned.end()) return ParamRole::kQuantizer;
  }
  if (std::find(t.norm_params.begin(), t.norm_params.end(), param) != t.norm_params.end()) return ParamRole::kNorm;
  return param == "bias" ? ParamRole::kBias : ParamRole::kWeight;
}

namespace {

// Every output channel c (on axis `axis`) bound to channel c of each input of the output's rank
// with the output's channel count on that axis (an operand broadcast along channels, or of lower
// rank, binds nothing).
ChannelMap same_channels(const std::vector<Shape>& in, const std::vector<Shape>& out, int64_t axis) {
  ChannelMap map(out.size());
  for (size_t o = 0; o < out.size(); ++o) {
    if (static_cast<int64_t>(out[o].size()) <= axis) continue;
    const int64_t c = out[o][static_cast<size_t>(axis)];
    map[o].assign(static_cast<size_t>(c), {});
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].size() != out[o].size() || in[i][static_cast<size_t>(axis)] != c) continue;
      for (int64_t k = 0; k < c; ++k) map[o][static_cast<size_t>(k)].push_back({static_cast<int>(i), k});
    }
  }
  return map;
}

int64_t wrapped(int64_t dim, size_t rank) { return dim < 0 ? dim + static_cast<int64_t>(rank) : dim; }

// The default map of a channel_flow, with the inputs' channels on axis `a` (input 0's).
std::optional<ChannelMap> flow_map(const Node& node, ChannelFlow flow, const std::vector<Shape>& in,
                                   const std::vector<Shape>& out, int64_t a, std::vector<int64_t>& out_axes) {
  out_axes.assign(out.size(), a);
  switch (flow) {
    case ChannelFlow::kProducerConsumer:
    case ChannelFlow::kOpaque: return std::nullopt;
    case ChannelFlow::kPassThrough: return same_channels({in.empty() ? Shape{} : in[0]}, out, a);
    case ChannelFlow::kElementwise: return same_channels(in, out, a);
    case ChannelFlow::kConcat: {
      if (in.empty() || wrapped(node.attr_int("dim"), in[0].size()) != a) return same_channels(in, out, a);
      ChannelMap map(1);
      for (size_t i = 0; i < in.size(); ++i)
        for (int64_t k = 0; k < in[i][static_cast<size_t>(a)]; ++k) map[0].push_back({{static_cast<int>(i), k}});
      return map;
    }
    case ChannelFlow::kSplit: {
      if (in.empty() || wrapped(node.attr_int("dim"), in[0].size()) != a) return same_channels(in, out, a);
      ChannelMap map(out.size());
      int64_t offset = 0;
      for (size_t o = 0; o < out.size(); ++o) {
        for (int64_t k = 0; k < out[o][static_cast<size_t>(a)]; ++k) map[o].push_back({{0, offset + k}});
        offset += out[o][static_cast<size_t>(a)];
      }
      return map;
    }
    case ChannelFlow::kExpand: {
      if (in.empty() || static_cast<int64_t>(in[0].size()) <= a || out.empty()) return std::nullopt;
      const int64_t start = wrapped(node.attr_int("start_dim"), in[0].size());
      if (start > a) return same_channels(in, out, a);
      if (static_cast<int64_t>(out[0].size()) <= start) return std::nullopt;
      // The features of dims start.. lie on output dim `start`; channel c of axis a repeats every
      // `inner` features (the product of the dims after a), C·inner at a time.
      const int64_t channels = in[0][static_cast<size_t>(a)], features = out[0][static_cast<size_t>(start)];
      int64_t inner = 1;
      for (size_t d = static_cast<size_t>(a) + 1; d < in[0].size(); ++d) inner *= in[0][d];
      if (channels == 0 || inner == 0 || features % (channels * inner) != 0) return std::nullopt;
      ChannelMap map(1);
      for (int64_t f = 0; f < features; ++f) map[0].push_back({{0, (f / inner) % channels}});
      out_axes.assign(out.size(), start);
      return map;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ChannelMap> channel_map(const Node& node, const std::vector<Shape>& in, const std::vector<Shape>& out,
                                      ChannelAxes* axes) {
  const OpTraits& t = op_traits(node.op);
  std::vector<int64_t> in_axes = axes ? axes->inputs : std::vector<int64_t>{};
  in_axes.resize(in.size(), 1);
  std::vector<int64_t> out_axes;
  std::optional<ChannelMap> map;
  const bool all_dim1 = std::all_of(in_axes.begin(), in_axes.end(), [](int64_t a) { return a == 1; });
  if (t.channel_map) {
    // An op's own map speaks of dim 1; with channels elsewhere it is opaque.
    if (all_dim1) map = t.channel_map(node, in, out);
    out_axes.assign(out.size(), 1);
  } else {
    const int64_t a = in_axes.empty() ? 1 : in_axes[0];
    // The inputs that share a map must carry their channels on one axis.
    const bool one_axis = std::all_of(in_axes.begin(), in_axes.end(), [&](int64_t x) { return x == a; });
    // A pass-through op whose tensors index channels (BN's statistics) indexes them on its own axis.
    const bool own_axis = t.channel_flow == ChannelFlow::kPassThrough && t.channel_tensors && !in.empty() &&
                          static_cast<int64_t>(in[0].size()) > a && channel_axis(node, in[0]) != a;
    if ((one_axis || t.channel_flow == ChannelFlow::kPassThrough) && !own_axis)
      map = flow_map(node, t.channel_flow, in, out, a, out_axes);
    else out_axes.assign(out.size(), a);
  }
  if (axes) axes->outputs = out_axes;
  return map;
}

std::vector<int64_t> channel_ties(const Node& node) {
  const OpTraits& t = op_traits(node.op);
  return t.channel_ties ? t.channel_ties(node) : std::vector<int64_t>{};
}

int64_t channel_axis(const Node& node, const Shape& shape) {
  const OpTraits& t = op_traits(node.op);
  const int64_t a = t.channel_axis ? t.channel_axis(node, shape) : 1;
  if (a < 0 || a >= static_cast<int64_t>(shape.size()))
    throw Error("node '" + node.name + "' (" + node.op + "): channel axis " + std::to_string(a) + " is not an axis of " +
                shape_str(shape));
  return a;
}

int64_t channel_groups(const Node& node) {
  // An op that declares `groups` divides its channels so; one that has no such attribute does not.
  return attr_spec(node, "groups") ? node.attr_int("groups") : 1;
}

void slice_channels(Node& node, ChannelRole side, const std::vector<int64_t>& keep) {
  const OpTraits& t = op_traits(node.op);
  if (t.slice_channels) t.slice_channels(node, side, keep);
  else slice_channel_tensors(node, side, keep);
}

void slice_channel_tensors(Node& node, ChannelRole side, const std::vector<int64_t>& keep) {
  auto fail = [&](const std::string& what) {
    throw Error("node '" + node.name + "' (" + node.op + "): cannot keep " + std::to_string(keep.size()) + " " +
                channel_role_name(side) + " channels: " + what);
  };
  for (size_t i = 0; i < keep.size(); ++i)
    if (keep[i] < 0 || (i > 0 && keep[i] <= keep[i - 1])) fail("channel indices must be ascending, unique and >= 0");
  if (keep.empty()) fail("at least one channel must stay");
  if (!node.params.contains("weight") && node.has_attr("weight_shape"))
    fail("its weight is packed (slice before the checkpoint is written)");
  const int64_t groups = channel_groups(node);
  for (const ChannelTensor& c : channel_tensors(node)) {
    if (c.role != side && c.role != ChannelRole::kChannel) continue;
    if (side == ChannelRole::kChannel && c.role != ChannelRole::kChannel) continue;
    at::Tensor* t = c.buffer ? node.buffers.find(c.name) : node.params.find(c.name);
    if (!t || !t->defined()) continue;
    if (c.axis >= t->dim()) fail(c.name + " has no axis " + std::to_string(c.axis));
    const int64_t size = t->size(c.axis);
    std::vector<int64_t> index = keep;
    if (c.per_group && groups > 1) {
      // Global channel g·size + j ↦ entry j of group g. Every group keeps the same number; when
      // they keep different entries, each group's slice (its share of axis 0, where the groups
      // of a conv weight are laid out) selects its own.
      std::vector<std::vector<int64_t>> local(static_cast<size_t>(groups));
      for (int64_t k : keep) {
        if (k >= size * groups) fail(c.name + ": channel " + std::to_string(k) + " out of range (" +
                                     std::to_string(size * groups) + " channels)");
        local[static_cast<size_t>(k / size)].push_back(k % size);
      }
      bool same = true;
      for (const auto& l : local) {
        if (l.size() != local[0].size())
          fail(c.name + ": with groups=" + std::to_string(groups) + " every group must keep the same number of channels");
        same = same && l == local[0];
      }
      if (!same) {
        if (c.axis == 0 || t->size(0) % groups != 0)
          fail(c.name + ": with groups=" + std::to_string(groups) + " every group must keep the same channels");
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> parts;
        const std::vector<at::Tensor> chunks = t->chunk(groups, 0);
        for (int64_t gi = 0; gi < groups; ++gi)
          parts.push_back(chunks[static_cast<size_t>(gi)].index_select(
              c.axis, at::tensor(local[static_cast<size_t>(gi)], at::TensorOptions().dtype(at::kLong).device(t->device()))));
        const bool grad = t->requires_grad();
        *t = at::cat(parts, 0).contiguous().set_requires_grad(grad);
        continue;
      }
      index = local[0];
    } else if (keep.back() >= size) {
      fail(c.name + ": channel " + std::to_string(keep.back()) + " out of range (" + c.name + " has " +
           std::to_string(size) + " on axis " + std::to_string(c.axis) + ")");
    }
    select_channels(*t, c.axis, index);
  }
}

void select_channels(at::Tensor& tensor, int64_t axis, const std::vector<int64_t>& index) {
  at::NoGradGuard no_grad;
  at::Tensor sliced =
      tensor.index_select(axis, at::tensor(index, at::TensorOptions().dtype(at::kLong).device(tensor.device()))).contiguous();
  sliced.set_requires_grad(tensor.requires_grad());
  tensor = sliced;
}

Registry<WeightTransform>& weight_transforms() {
  ensure_builtins();  // the built-in "mask" registers with the built-in ops
  return raw_transforms();
}

void register_weight_transform(WeightTransform transform) {
  if (transform.name.empty() || !transform.apply) throw Error("register_weight_transform: needs a name and a function");
  const std::string name = transform.name;
  raw_transforms().add(name, std::move(transform));
}

std::vector<std::string> registered_weight_transforms() { return weight_transforms().names(); }

const WeightTransform& weight_transform(const std::string& name) { return weight_transforms().get(name); }

at::Tensor transformed_weight(const Node& node, bool training, size_t stages) {
  const at::Tensor* w = node.params.find("weight");
  at::Tensor weight = w ? *w : at::Tensor();
  const size_t n = std::min(stages, node.weight_transforms.size());
  for (size_t i = 0; i < n; ++i) weight = weight_transform(node.weight_transforms[i]).apply(node, weight, training);
  return weight;
}

bool has_weight_transform(const Node& node, const std::string& name) {
  return std::find(node.weight_transforms.begin(), node.weight_transforms.end(), name) != node.weight_transforms.end();
}

int64_t find_transform_kind(const Node& node, TransformKind kind) {
  for (size_t i = 0; i < node.weight_transforms.size(); ++i)
    if (weight_transform(node.weight_transforms[i]).kind == kind) return static_cast<int64_t>(i);
  return -1;
}

void push_weight_transform(Node& node, const std::string& name, int64_t at) {
  weight_transform(name);  // throws for an unknown one
  if (has_weight_transform(node, name))
    throw Error("node '" + node.name + "': weight transform '" + name + "' is already in its stack");
  auto& s = node.weight_transforms;
  if (at < 0 || at >= static_cast<int64_t>(s.size())) s.push_back(name);
  else s.insert(s.begin() + at, name);
}

bool erase_weight_transform(Node& node, const std::string& name) {
  auto& s = node.weight_transforms;
  auto it = std::find(s.begin(), s.end(), name);
  if (it == s.end()) return false;
  s.erase(it);
  const WeightTransform& t = weight_transform(name);
  for (const auto& a : t.attributes) node.attrs.erase(a.name);
  for (const auto& b : t.buffers) node.buffers.erase(b);
  for (const auto& p : t.params) node.params.erase(p);
  return true;
}

// ---------------------------------------------------------------- attributes

Registry<AttrSpec>& node_annotations() {
  static Registry<AttrSpec> r("node annotation", "annotations",
                              [](const AttrSpec& a) { return a.description + " (" + a.summary() + ")"; },
                              ErrorKind::kRuntime);
  return r;
}

void register_node_annotation(AttrSpec spec) {
  if (spec.name.empty()) throw Error("register_node_annotation: needs a name");
  const std::string name = spec.name;
  node_annotations().add(name, std::move(spec));
}

namespace {

const AttrSpec* find_in(const std::vector<AttrSpec>& specs, const std::string& key) {
  for (const AttrSpec& a : specs)
    if (a.name == key) return &a;
  return nullptr;
}

}  // namespace

namespace {

// Calls fn on each list of declarations that applies to `node`, in attr_spec()'s order of
// precedence (its op's, the op's node-dependent ones, each transform's and theirs), until fn
// returns true; returns whether one did.
template <typename Fn>
bool visit_declarations(const Node& node, Fn&& fn) {
  auto visit = [&](const std::vector<AttrSpec>& own, const auto& dependent) {
    if (fn(own)) return true;
    if (!dependent) return false;
    const std::vector<AttrSpec>* extra = dependent(node);
    return extra && fn(*extra);
  };
  const OpTraits& t = op_traits(node.op);
  if (visit(t.attributes, t.node_attributes)) return true;
  for (const auto& name : node.weight_transforms)
    if (const WeightTransform* w = weight_transforms().find(name))
      if (visit(w->attributes, w->node_attributes)) return true;
  return false;
}

}  // namespace

const AttrSpec* attr_spec(const Node& node, const std::string& key) {
  const AttrSpec* found = nullptr;
  visit_declarations(node, [&](const std::vector<AttrSpec>& specs) { return (found = find_in(specs, key)) != nullptr; });
  return found ? found : node_annotations().find(key);
}

std::vector<const AttrSpec*> attr_specs(const Node& node) {
  std::vector<const AttrSpec*> out;
  visit_declarations(node, [&](const std::vector<AttrSpec>& specs) {
    for (const AttrSpec& a : specs) out.push_back(&a);
    return false;
  });
  return out;
}

void check_attributes(const Node& node) {
  const std::string where = "node '" + node.name + "' (" + node.op + ")";
  std::set<std::string> seen;
  for (const auto& name : node.weight_transforms) {
    if (!weight_transforms().find(name)) weight_transform(name);  // throws, listing the known ones
    if (!seen.insert(name).second) throw Error(where + ": weight transform '" + name + "' appears twice in its stack");
  }
  auto check_value = [&](const std::string& key, const Attr& value, const AttrSpec& spec) {
    std::string problem = spec.problem(value);
    if (problem.empty() && spec.check) problem = spec.check(node, value);
    if (!problem.empty()) throw Error(where + ": attribute '" + key + "' " + problem);
  };
  // The op's own attributes first: the others' declarations may depend on them (an act_quant's
  // `method` names the quantizer that declares the rest).
  const OpTraits& traits = op_traits(node.op);
  for (const auto& [key, value] : node.attrs)
    if (const AttrSpec* spec = find_in(traits.attributes, key)) check_value(key, value, *spec);
  const std::vector<const AttrSpec*> specs = attr_specs(node);
  for (const auto& [key, value] : node.attrs) {
    const AttrSpec* spec = attr_spec(node, key);
    if (!spec) {
      std::string known;
      for (const AttrSpec* a : specs) known += (known.empty() ? "" : ", ") + a->name;
      throw Error(where + ": unknown attribute '" + key + "' (" +
                  (known.empty() ? std::string("it declares none") : "it declares " + known) + ")");
    }
    check_value(key, value, *spec);
  }
  for (const AttrSpec* a : specs)
    if (a->required && !node.has_attr(a->name)) throw Error(where + ": missing attribute '" + a->name + "'");
}

std::string transform_stack_problem(const Node& node) {
  for (const auto& name : node.weight_transforms)
    if (weight_transform(name).kind != TransformKind::kMask)
      return "'" + node.name + "' runs with weight transform '" + name + "' (its weight is not a plain tensor)";
  return "";
}

void register_mask_transform() {
  WeightTransform t;
  t.name = "mask";
  t.description = "pruning mask: weight ⊙ weight_mask (buffer of the weight's shape, 0/1)";
  t.kind = TransformKind::kMask;
  t.buffers = {"weight_mask"};
  t.apply = [](const Node& n, const at::Tensor& w, bool) {
    const at::Tensor* m = n.buffers.find("weight_mask");
    if (!w.defined()) throw Error("node '" + n.name + "': transform 'mask' needs a weight");
    if (!m || !m->defined() || m->sizes() != w.sizes())
      throw Error("node '" + n.name + "': transform 'mask' needs a buffer 'weight_mask' of shape " + shape_str(w.sizes().vec()));
    return w * *m;
  };
  register_weight_transform(std::move(t));
}

std::optional<Node> with_placeholder_weight(const Node& node) {
  if (node.params.contains("weight") || node.weight_transforms.empty() || !node.has_attr("weight_shape"))
    return std::nullopt;
  const std::vector<int64_t> shape = node.attr_ints("weight_shape");
  if (!elements_within_limit(shape))
    throw Error("node '" + node.name + "' (" + node.op + "): weight_shape " + shape_str(shape) + " has " +
                shape_limit_problem(shape));
  Node copy = node;
  copy.params.set("weight", at::empty(shape, at::TensorOptions().device(at::kMeta)));
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
    if (__builtin_add_overflow(total.macs, c.macs, &total.macs))
      throw Error("the model's multiply-accumulate count does not fit 64 bits (shapes too large)");
  }
  return total;
}

}  // namespace whittle
