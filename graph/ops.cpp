// The built-in op set: one OpTraits entry per op kind (see op_registry.h).
//
// Each entry declares its attributes (type, default as in torch.nn, valid range) in its
// `attributes`; `whittle inspect --ops` lists them and Graph::validate() checks them.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/shape_limits.h"
#include "graph/functional.h"
#include "graph/op_registry.h"

namespace whittle {
namespace detail {
void register_builtin(OpTraits traits);
}

namespace {

[[noreturn]] void fail(const Node& n, const std::string& msg) {
  throw Error("node '" + n.name + "' (" + n.op + "): " + msg);
}

// A MAC count that fits int64, or an error naming the node.
int64_t macs_or_throw(const Node& n, std::optional<int64_t> macs) {
  if (!macs) fail(n, "its multiply-accumulate count does not fit 64 bits (shapes too large)");
  return *macs;
}

// Declarations shared by several ops.
AttrSpec window(const char* name, int64_t fallback, int64_t least, const char* description) {
  return AttrSpec::pair(name, fallback, description).range(static_cast<double>(least), std::nullopt);
}
AttrSpec groups_attr() { return AttrSpec::integer("groups", 1, "channel groups (torch.nn.Conv2d groups)").range(1, std::nullopt); }
std::vector<AttrSpec> conv_attrs() {
  return {window("stride", 1, 1, "step of the window per axis"), window("padding", 0, 0, "zeros added on each side per axis"),
          window("dilation", 1, 1, "spacing of the kernel taps per axis"), groups_attr()};
}

int64_t wrap_dim(const Node& n, int64_t dim, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  int64_t d = dim < 0 ? dim + r : dim;
  if (d < 0 || d >= r) fail(n, "dimension " + std::to_string(dim) + " out of range for rank " + std::to_string(rank));
  return d;
}

void require_rank(const Node& n, const Shape& s, size_t rank, const char* what) {
  if (s.size() != rank) fail(n, std::string("expects a ") + what + " input, got shape " + shape_str(s));
}

int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) { return (in + 2 * p - d * (k - 1) - 1) / s + 1; }

int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  int64_t num = in + 2 * p - d * (k - 1) - 1;
  int64_t out = (ceil_mode ? (num + s - 1) / s : num / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

const at::Tensor& param_or_undefined(const Node& n, const std::string& name) {
  static const at::Tensor undefined;
  const at::Tensor* t = n.params.find(name);
  return t ? *t : undefined;
}

std::vector<at::Tensor> one(at::Tensor t) { return {std::move(t)}; }

ChannelTensorsFn fixed_channels(std::vector<ChannelTensor> tensors) {
  return [tensors](const Node&) { return tensors; };
}

// conv2d / conv_transpose2d: groups > 1 constrains which subsets exist. Depthwise (groups = Cin =
// Cout) ties input and output channels: keeping channel c keeps its filter, on both sides, and
// `groups` becomes the number kept. Otherwise every group keeps the same number of channels on
// the side sliced (and, on a per-group axis, the same ones).
void slice_conv(Node& n, ChannelRole side, const std::vector<int64_t>& keep) {
  const int64_t g = n.attr_int("groups");
  const at::Tensor* w = n.params.find("weight");
  if (g == 1 || !w || !w->defined()) return slice_channel_tensors(n, side, keep);
  const bool transposed = n.op == "conv_transpose2d";
  const int64_t cin = transposed ? w->size(0) : w->size(1) * g;
  const int64_t cout = transposed ? w->size(1) * g : w->size(0);
  if ((g == cin && g == cout) || (!transposed && g == cin && cout % g == 0)) {
    // Depthwise (groups = in = out) or a channel multiplier m (groups = in, out = m·in): input
    // channel i is group i and feeds outputs [m·i, m·(i+1)). Keeping input channels (or whole
    // output blocks) keeps those groups; the per-group axis has one entry and stays.
    const int64_t m = cout / g;
    for (size_t i = 1; i < keep.size(); ++i)
      if (keep[i] <= keep[i - 1]) fail(n, "channel indices to keep must be ascending and unique");
    const int64_t limit = side == ChannelRole::kOutput ? cout : cin;
    if (keep.empty() || keep.front() < 0 || keep.back() >= limit)
      fail(n, std::string("cannot keep these ") + channel_role_name(side) + " channels (" + std::to_string(limit) + ")");
    std::vector<int64_t> outputs;
    int64_t kept_groups = 0;
    if (side == ChannelRole::kOutput) {
      for (size_t i = 0; i < keep.size(); i += static_cast<size_t>(m)) {
        const int64_t group = keep[i] / m;
        for (int64_t j = 0; j < m; ++j)
          if (i + static_cast<size_t>(j) >= keep.size() || keep[i + static_cast<size_t>(j)] != group * m + j)
            fail(n, "with groups = in_channels = " + std::to_string(g) + " the outputs of a group (" + std::to_string(m) +
                        " per input channel) are kept or removed together");
        ++kept_groups;
      }
      outputs = keep;
    } else {
      for (int64_t i : keep)
        for (int64_t j = 0; j < m; ++j) outputs.push_back(i * m + j);
      kept_groups = static_cast<int64_t>(keep.size());
    }
    for (const ChannelTensor& c : op_traits(n.op).channel_tensors(n)) {
      if (c.per_group) continue;
      at::Tensor* t = c.buffer ? n.buffers.find(c.name) : n.params.find(c.name);
      if (!t || !t->defined()) continue;
      select_channels(*t, c.axis, outputs);
    }
    n.attrs["groups"] = kept_groups;
    return;
  }
  const int64_t per = (side == ChannelRole::kOutput ? cout : cin) / g;
  std::vector<int64_t> count(static_cast<size_t>(g), 0);
  for (int64_t k : keep)
    if (k / per < g) ++count[static_cast<size_t>(k / per)];
  for (int64_t c : count)
    if (c != count[0])
      fail(n, std::string("cannot keep these ") + channel_role_name(side) + " channels: with groups=" +
                  std::to_string(g) + " every group must keep the same number");
  slice_channel_tensors(n, side, keep);
}

// Registers an elementwise single-input op whose shape is its input's.
void unary(const std::string& kind, const std::string& desc, ChannelFlow flow,
           std::function<at::Tensor(const Node&, const at::Tensor&, bool)> f, std::vector<AttrSpec> attributes = {}) {
  OpTraits t;
  t.kind = kind;
  t.attributes = std::move(attributes);
  t.description = desc;
  t.channel_flow = flow;
  t.forward = [f](const Node& n, const std::vector<at::Tensor>& in, bool training) { return one(f(n, in[0], training)); };
  t.infer_shapes = [](const Node&, const std::vector<Shape>& in) { return std::vector<Shape>{in[0]}; };
  detail::register_builtin(std::move(t));
}

// conv2d: output channels bound to input channels when each group reads one input channel
// (depthwise, or a channel multiplier): output c reads input c / (out / groups).
std::vector<int64_t> conv_ties(const Node& n) {
  const int64_t g = n.attr_int("groups");
  const at::Tensor* w = n.params.find("weight");
  if (g <= 1 || !w || !w->defined() || w->dim() != 4) return {};
  const bool transposed = n.op == "conv_transpose2d";
  const int64_t cin = transposed ? w->size(0) : w->size(1) * g;
  const int64_t cout = transposed ? w->size(1) * g : w->size(0);
  if (transposed ? !(g == cin && g == cout) : !(g == cin && cout % g == 0)) return {};
  std::vector<int64_t> ties(static_cast<size_t>(cout));
  for (int64_t c = 0; c < cout; ++c) ties[static_cast<size_t>(c)] = c / (cout / g);
  return ties;
}

void register_conv() {
  OpTraits t;
  t.kind = "conv2d";
  t.attributes = conv_attrs();
  t.channel_ties = conv_ties;
  t.description = "2-D convolution (torch.nn.Conv2d), zero padding";
  t.channel_flow = ChannelFlow::kProducerConsumer;
  t.required_params = {"weight"};
  t.optional_params = {"bias"};
  t.channel_tensors = fixed_channels({{"weight", false, ChannelRole::kOutput, 0, false},
                                      {"weight", false, ChannelRole::kInput, 1, true},
                                      {"bias", false, ChannelRole::kOutput, 0, false}});
  t.slice_channels = slice_conv;
  t.folds_batchnorm = true;
  t.torchscript_ops = {"aten::conv2d", "aten::_convolution"};
  t.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return one(at::conv2d(in[0], n.params.at("weight"), param_or_undefined(n, "bias"), n.attr_pair("stride"),
                          n.attr_pair("padding"), n.attr_pair("dilation"), n.attr_int("groups")));
  };
  t.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    require_rank(n, in[0], 4, "4-D NCHW");
    const auto w = n.params.at("weight").sizes();
    if (w.size() != 4) fail(n, "weight must be 4-D [Cout, Cin/groups, kh, kw], got " + shape_str(w.vec()));
    const int64_t g = n.attr_int("groups");
    if (g < 1 || in[0][1] % g != 0 || w[0] % g != 0)
      fail(n, "groups=" + std::to_string(g) + " does not divide in_channels " + std::to_string(in[0][1]) +
                  " and out_channels " + std::to_string(w[0]));
    if (w[1] * g != in[0][1])
      fail(n, "input has " + std::to_string(in[0][1]) + " channels but weight " + shape_str(w.vec()) + " with groups=" +
                  std::to_string(g) + " expects " + std::to_string(w[1] * g));
    if (const at::Tensor* b = n.params.find("bias"); b && b->defined() && (b->dim() != 1 || b->size(0) != w[0]))
      fail(n, "bias has shape " + shape_str(b->sizes().vec()) + ", expected [" + std::to_string(w[0]) + "]");
    auto s = n.attr_pair("stride"), p = n.attr_pair("padding"), d = n.attr_pair("dilation");
    int64_t h = conv_out(in[0][2], w[2], s[0], p[0], d[0]), wo = conv_out(in[0][3], w[3], s[1], p[1], d[1]);
    if (h < 1 || wo < 1) fail(n, "input " + shape_str(in[0]) + " is too small for kernel " + shape_str({w[2], w[3]}));
    return std::vector<Shape>{{in[0][0], w[0], h, wo}};
  };
  t.macs = [](const Node& n, const std::vector<Shape>&, const std::vector<Shape>& out) {
    const auto w = n.params.at("weight").sizes();
    return macs_or_throw(n, checked_product({out[0][0], out[0][1], out[0][2], out[0][3], w[1], w[2], w[3]}));
  };
  detail::register_builtin(std::move(t));

  OpTraits ct;
  ct.kind = "conv_transpose2d";
  ct.attributes = conv_attrs();
  ct.attributes.push_back(window("output_padding", 0, 0, "size added to one side of the output per axis"));
  ct.description = "2-D transposed convolution (torch.nn.ConvTranspose2d)";
  ct.channel_flow = ChannelFlow::kProducerConsumer;
  ct.required_params = {"weight"};
  ct.channel_tensors = fixed_channels({{"weight", false, ChannelRole::kInput, 0, false},
                                       {"weight", false, ChannelRole::kOutput, 1, true},
                                       {"bias", false, ChannelRole::kOutput, 0, false}});
  ct.slice_channels = slice_conv;
  ct.channel_ties = conv_ties;
  ct.folds_batchnorm = true;
  ct.torchscript_ops = {"aten::conv_transpose2d"};
  ct.optional_params = {"bias"};
  ct.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return one(at::conv_transpose2d(in[0], n.params.at("weight"), param_or_undefined(n, "bias"), n.attr_pair("stride"),
                                    n.attr_pair("padding"), n.attr_pair("output_padding"), n.attr_int("groups"),
                                    n.attr_pair("dilation")));
  };
  ct.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    require_rank(n, in[0], 4, "4-D NCHW");
    const auto w = n.params.at("weight").sizes();
    if (w.size() != 4) fail(n, "weight must be 4-D [Cin, Cout/groups, kh, kw], got " + shape_str(w.vec()));
    const int64_t g = n.attr_int("groups");
    if (w[0] != in[0][1])
      fail(n, "input has " + std::to_string(in[0][1]) + " channels but weight " + shape_str(w.vec()) + " expects " +
                  std::to_string(w[0]));
    if (g < 1 || w[0] % g != 0) fail(n, "groups=" + std::to_string(g) + " does not divide in_channels");
    auto s = n.attr_pair("stride"), p = n.attr_pair("padding"), op = n.attr_pair("output_padding"), d = n.attr_pair("dilation");
    int64_t h = (in[0][2] - 1) * s[0] - 2 * p[0] + d[0] * (w[2] - 1) + op[0] + 1;
    int64_t wo = (in[0][3] - 1) * s[1] - 2 * p[1] + d[1] * (w[3] - 1) + op[1] + 1;
    if (h < 1 || wo < 1) fail(n, "padding " + shape_str(p) + " leaves no output for input " + shape_str(in[0]));
    return std::vector<Shape>{{in[0][0], w[1] * g, h, wo}};
  };
  ct.macs = [](const Node& n, const std::vector<Shape>& in, const std::vector<Shape>&) {
    const auto w = n.params.at("weight").sizes();
    return macs_or_throw(n, checked_product({in[0][0], in[0][1], in[0][2], in[0][3], w[1], w[2], w[3]}));
  };
  detail::register_builtin(std::move(ct));

  OpTraits l;
  l.kind = "linear";
  l.description = "fully connected layer y = x W^T + b (torch.nn.Linear)";
  l.channel_flow = ChannelFlow::kProducerConsumer;
  l.required_params = {"weight"};
  l.optional_params = {"bias"};
  l.channel_tensors = fixed_channels({{"weight", false, ChannelRole::kOutput, 0, false},
                                      {"weight", false, ChannelRole::kInput, 1, false},
                                      {"bias", false, ChannelRole::kOutput, 0, false}});
  // [N, *, in] → [N, *, out]: the features, consumed and produced, are the last axis.
  l.channel_axis = [](const Node&, const Shape& shape) { return static_cast<int64_t>(shape.size()) - 1; };
  l.folds_batchnorm = true;
  l.torchscript_ops = {"aten::linear", "aten::addmm", "aten::matmul", "aten::mm"};
  l.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return one(at::linear(in[0], n.params.at("weight"), param_or_undefined(n, "bias")));
  };
  l.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    const auto w = n.params.at("weight").sizes();
    if (w.size() != 2) fail(n, "weight must be 2-D [out, in], got " + shape_str(w.vec()));
    if (in[0].empty() || in[0].back() != w[1])
      fail(n, "input " + shape_str(in[0]) + " does not end in in_features " + std::to_string(w[1]));
    Shape out = in[0];
    out.back() = w[0];
    return std::vector<Shape>{out};
  };
  l.macs = [](const Node& n, const std::vector<Shape>& in, const std::vector<Shape>&) {
    const auto w = n.params.at("weight").sizes();
    std::optional<int64_t> rows = 1;
    for (size_t i = 0; rows && i + 1 < in[0].size(); ++i) rows = checked_product({*rows, in[0][i]});
    return macs_or_throw(n, rows ? checked_product({*rows, w[0], w[1]}) : std::nullopt);
  };
  detail::register_builtin(std::move(l));
}

void register_batch_norm() {
  OpTraits t;
  t.kind = "batch_norm";
  t.attributes = {AttrSpec::number("eps", 1e-5, "added to the variance").range(0, std::nullopt),
                  AttrSpec::number("momentum", 0.1, "running statistics update factor; below 0: cumulative average")
                      .range(std::nullopt, 1)};
  t.description = "batch normalization over dim 1 (BatchNorm1d/2d); batch statistics in training";
  t.channel_flow = ChannelFlow::kPassThrough;
  t.optional_params = {"weight", "bias"};
  t.norm_params = {"weight", "bias"};
  t.norm_scale = "weight";
  t.required_buffers = {"running_mean", "running_var"};
  t.channel_tensors = fixed_channels({{"weight", false, ChannelRole::kChannel, 0, false},
                                      {"bias", false, ChannelRole::kChannel, 0, false},
                                      {"running_mean", true, ChannelRole::kChannel, 0, false},
                                      {"running_var", true, ChannelRole::kChannel, 0, false}});
  t.torchscript_ops = {"aten::batch_norm"};
  t.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool training) {
    return one(batch_norm_forward(in[0], param_or_undefined(n, "weight"), param_or_undefined(n, "bias"),
                                  n.buffers.at("running_mean"), n.buffers.at("running_var"),
                                  n.buffers.find("num_batches_tracked"), training, n.attr_float("momentum"),
                                  n.attr_float("eps")));
  };
  t.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    if (in[0].size() < 2) fail(n, "expects input [N, C, ...], got " + shape_str(in[0]));
    const int64_t c = in[0][1];
    auto check_c = [&](const NamedTensors& ts, const std::string& name) {
      const at::Tensor* t = ts.find(name);
      if (t && t->defined() && (t->dim() != 1 || t->size(0) != c))
        fail(n, name + " has shape " + shape_str(t->sizes().vec()) + " but the input has " + std::to_string(c) + " channels");
    };
    check_c(n.params, "weight");
    check_c(n.params, "bias");
    check_c(n.buffers, "running_mean");
    check_c(n.buffers, "running_var");
    return std::vector<Shape>{in[0]};
  };
  detail::register_builtin(std::move(t));
}

void register_activations() {
  const auto pt = ChannelFlow::kPassThrough;
  unary("relu", "max(x, 0)", pt, [](const Node&, const at::Tensor& x, bool) { return at::relu(x); });
  unary("relu6", "min(max(x, 0), 6)", pt, [](const Node&, const at::Tensor& x, bool) { return at::hardtanh(x, 0.0, 6.0); });
  unary("leaky_relu", "x if x >= 0 else negative_slope·x", pt, [](const Node& n, const at::Tensor& x, bool) {
    return at::leaky_relu(x, n.attr_float("negative_slope"));
  }, {AttrSpec::number("negative_slope", 0.01, "slope for x < 0")});
  unary("hardtanh", "clip(x, min_val, max_val)", pt, [](const Node& n, const at::Tensor& x, bool) {
    return at::hardtanh(x, n.attr_float("min_val"), n.attr_float("max_val"));
  }, {AttrSpec::number("min_val", -1.0, "lower clip"), AttrSpec::number("max_val", 1.0, "upper clip")});
  unary("sigmoid", "1 / (1 + exp(-x))", pt, [](const Node&, const at::Tensor& x, bool) { return at::sigmoid(x); });
  unary("tanh", "tanh(x)", pt, [](const Node&, const at::Tensor& x, bool) { return at::tanh(x); });
  unary("silu", "x·sigmoid(x)", pt, [](const Node&, const at::Tensor& x, bool) { return at::silu(x); });
  unary("hardswish", "x·relu6(x+3)/6", pt, [](const Node&, const at::Tensor& x, bool) { return at::hardswish(x); });
  unary("hardsigmoid", "relu6(x+3)/6", pt, [](const Node&, const at::Tensor& x, bool) { return at::hardsigmoid(x); });
  unary("gelu", "x·Φ(x) (approximate: none | tanh)", pt, [](const Node& n, const at::Tensor& x, bool) {
    return at::gelu(x, n.attr_str("approximate"));
  }, {AttrSpec::text("approximate", "none", "Φ exact or by its tanh form").one_of({"none", "tanh"})});
  unary("dropout", "zeroes elements with probability p in training, identity in eval", pt,
        [](const Node& n, const at::Tensor& x, bool training) { return at::dropout(x, n.attr_float("p"), training); },
        {AttrSpec::number("p", 0.5, "probability of zeroing").range(0, 1)});
  unary("feature_dropout", "zeroes whole channels with probability p in training (Dropout2d), identity in eval", pt,
        [](const Node& n, const at::Tensor& x, bool training) {
          return at::feature_dropout(x, n.attr_float("p"), training);
        },
        {AttrSpec::number("p", 0.5, "probability of zeroing a channel").range(0, 1)});
  unary("identity", "y = x", pt, [](const Node&, const at::Tensor& x, bool) { return x; });
  unary("softmax", "softmax over dim", ChannelFlow::kOpaque, [](const Node& n, const at::Tensor& x, bool) {
    return at::softmax(x, n.attr_int("dim"));
  }, {AttrSpec::integer("dim", -1, "the dimension normalized over")});
}

// A [C] tensor viewed to broadcast along dim 1 of a rank-`rank` value: [1, C, 1, ...].
at::Tensor channel_view(const at::Tensor& t, int64_t rank) {
  std::vector<int64_t> view(static_cast<size_t>(rank), 1);
  view[1] = t.size(0);
  return at::reshape(t, view);
}

// RPReLU (ReActNet, Liu et al. 2020, eq. 3): y = x − γ + ζ where x > γ, β·(x − γ) + ζ elsewhere,
// i.e. PReLU(x − γ; β) + ζ with γ (shift_in), β (slope) and ζ (shift_out) learned per channel.
// γ = ζ = 0 and β = 0 is exactly a ReLU.
void register_rprelu() {
  OpTraits t;
  t.kind = "rprelu";
  t.description = "ReActNet RPReLU (Liu et al. 2020): PReLU(x − shift_in; slope) + shift_out, each [C] over dim 1";
  t.channel_flow = ChannelFlow::kPassThrough;
  t.required_params = {"shift_in", "slope", "shift_out"};
  t.channel_tensors = fixed_channels({{"shift_in", false, ChannelRole::kChannel, 0, false},
                                      {"slope", false, ChannelRole::kChannel, 0, false},
                                      {"shift_out", false, ChannelRole::kChannel, 0, false}});
  t.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    const int64_t rank = in[0].dim();
    return one(at::prelu(in[0] - channel_view(n.params.at("shift_in"), rank), n.params.at("slope")) +
               channel_view(n.params.at("shift_out"), rank));
  };
  t.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    if (in[0].size() < 2) fail(n, "expects input [N, C, ...], got " + shape_str(in[0]));
    for (const char* name : {"shift_in", "slope", "shift_out"}) {
      const at::Tensor& p = n.params.at(name);
      if (p.dim() != 1 || p.size(0) != in[0][1])
        fail(n, std::string(name) + " has shape " + shape_str(p.sizes().vec()) + " but the input has " +
                    std::to_string(in[0][1]) + " channels");
    }
    return std::vector<Shape>{in[0]};
  };
  detail::register_builtin(std::move(t));
}

void register_pooling() {
  OpTraits mp;
  mp.kind = "max_pool2d";
  mp.attributes = {AttrSpec::needed("kernel_size", AttrType::kPair, "window size per axis").range(1, std::nullopt),
                   AttrSpec::optional("stride", AttrType::kPair, "step per axis; absent: kernel_size").range(1, std::nullopt),
                   window("padding", 0, 0, "implicit -inf padding per axis"),
                   window("dilation", 1, 1, "spacing of the window taps per axis"),
                   AttrSpec::boolean("ceil_mode", false, "round the output size up")};
  mp.description = "2-D max pooling";
  mp.channel_flow = ChannelFlow::kPassThrough;
  mp.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    auto k = n.attr_pair("kernel_size");
    return one(at::max_pool2d(in[0], k, n.has_attr("stride") ? n.attr_pair("stride") : k, n.attr_pair("padding"),
                              n.attr_pair("dilation"), n.attr_bool("ceil_mode")));
  };
  mp.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    require_rank(n, in[0], 4, "4-D NCHW");
    if (!n.has_attr("kernel_size")) fail(n, "missing attribute 'kernel_size'");
    auto k = n.attr_pair("kernel_size"), s = n.has_attr("stride") ? n.attr_pair("stride") : k;
    auto p = n.attr_pair("padding"), d = n.attr_pair("dilation");
    bool c = n.attr_bool("ceil_mode");
    Shape out{in[0][0], in[0][1], pool_out(in[0][2], k[0], s[0], p[0], d[0], c), pool_out(in[0][3], k[1], s[1], p[1], d[1], c)};
    if (out[2] < 1 || out[3] < 1) fail(n, "input " + shape_str(in[0]) + " is too small for the pooling window");
    return std::vector<Shape>{out};
  };
  detail::register_builtin(std::move(mp));

  OpTraits ap;
  ap.kind = "avg_pool2d";
  ap.attributes = {AttrSpec::needed("kernel_size", AttrType::kPair, "window size per axis").range(1, std::nullopt),
                   AttrSpec::optional("stride", AttrType::kPair, "step per axis; absent: kernel_size").range(1, std::nullopt),
                   window("padding", 0, 0, "implicit zero padding per axis"),
                   AttrSpec::boolean("ceil_mode", false, "round the output size up"),
                   AttrSpec::boolean("count_include_pad", true, "padding counts in the divisor"),
                   AttrSpec::integer("divisor_override", 0, "divisor instead of the window size; 0: none").range(0, std::nullopt)};
  ap.description = "2-D average pooling";
  ap.channel_flow = ChannelFlow::kPassThrough;
  ap.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    auto k = n.attr_pair("kernel_size");
    int64_t div = n.attr_int("divisor_override");
    return one(at::avg_pool2d(in[0], k, n.has_attr("stride") ? n.attr_pair("stride") : k, n.attr_pair("padding"),
                              n.attr_bool("ceil_mode"), n.attr_bool("count_include_pad"),
                              div > 0 ? std::optional<int64_t>(div) : std::nullopt));
  };
  ap.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    require_rank(n, in[0], 4, "4-D NCHW");
    if (!n.has_attr("kernel_size")) fail(n, "missing attribute 'kernel_size'");
    auto k = n.attr_pair("kernel_size"), s = n.has_attr("stride") ? n.attr_pair("stride") : k;
    auto p = n.attr_pair("padding");
    bool c = n.attr_bool("ceil_mode");
    Shape out{in[0][0], in[0][1], pool_out(in[0][2], k[0], s[0], p[0], 1, c), pool_out(in[0][3], k[1], s[1], p[1], 1, c)};
    if (out[2] < 1 || out[3] < 1) fail(n, "input " + shape_str(in[0]) + " is too small for the pooling window");
    return std::vector<Shape>{out};
  };
  detail::register_builtin(std::move(ap));

  OpTraits aap;
  aap.kind = "adaptive_avg_pool2d";
  aap.attributes = {window("output_size", 1, 1, "output height and width")};
  aap.description = "2-D adaptive average pooling to output_size";
  aap.channel_flow = ChannelFlow::kPassThrough;
  aap.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return one(at::adaptive_avg_pool2d(in[0], n.attr_pair("output_size")));
  };
  aap.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    require_rank(n, in[0], 4, "4-D NCHW");
    auto o = n.attr_pair("output_size");
    return std::vector<Shape>{{in[0][0], in[0][1], o[0], o[1]}};
  };
  detail::register_builtin(std::move(aap));
}

void register_shape_ops() {
  OpTraits f;
  f.kind = "flatten";
  f.attributes = {AttrSpec::integer("start_dim", 1, "first dimension flattened"),
                  AttrSpec::integer("end_dim", -1, "last dimension flattened")};
  f.description = "flattens dims start_dim..end_dim";
  f.channel_flow = ChannelFlow::kExpand;
  f.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return one(in[0].flatten(n.attr_int("start_dim"), n.attr_int("end_dim")));
  };
  f.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    int64_t s = wrap_dim(n, n.attr_int("start_dim"), in[0].size());
    int64_t e = wrap_dim(n, n.attr_int("end_dim"), in[0].size());
    if (e < s) fail(n, "end_dim before start_dim");
    Shape out(in[0].begin(), in[0].begin() + s);
    int64_t p = 1;
    for (int64_t i = s; i <= e; ++i) p *= in[0][i];
    out.push_back(p);
    out.insert(out.end(), in[0].begin() + e + 1, in[0].end());
    return std::vector<Shape>{out};
  };
  detail::register_builtin(std::move(f));

  OpTraits r;
  r.kind = "reshape";
  r.attributes = {AttrSpec::needed("shape", AttrType::kInts, "the dims after the batch dimension; one may be -1")
                      .range(-1, std::nullopt)};
  r.description = "reshape keeping the batch dimension: output [N, shape...] (view/reshape)";
  r.channel_flow = ChannelFlow::kOpaque;
  // Pruning removed input positions: a reshape to [N, F] becomes [N, -1]; one to [N, C, ...]
  // from features gets the channel count the kept features make.
  r.slice_channels = [](Node& n, ChannelRole, const std::vector<int64_t>& keep) {
    std::vector<int64_t> shape = n.attr_ints("shape");
    if (shape.size() == 1) {
      shape[0] = -1;
    } else if (!shape.empty() && shape[0] != -1) {
      int64_t rest = 1;
      for (size_t i = 1; i < shape.size(); ++i) rest *= shape[i];
      if (rest <= 0 || static_cast<int64_t>(keep.size()) % rest != 0)
        fail(n, "cannot keep " + std::to_string(keep.size()) + " features as channels of " + shape_str(shape));
      shape[0] = static_cast<int64_t>(keep.size()) / rest;
    }
    n.attrs["shape"] = shape;
  };
  // Between [N, C, H, W] and [N, C·H·W] (either way) channels are followed: channel c is features
  // [c·H·W, (c+1)·H·W). Any other reshape is opaque to pruning.
  r.channel_map = [](const Node&, const std::vector<Shape>& in, const std::vector<Shape>& out) -> std::optional<ChannelMap> {
    if (in.size() != 1 || out.size() != 1) return std::nullopt;
    auto elements = [](const Shape& s) {
      int64_t p = 1;
      for (size_t i = 1; i < s.size(); ++i) p *= s[i];
      return p;
    };
    const Shape& a = in[0];
    const Shape& b = out[0];
    if (a.size() < 2 || b.size() < 2 || elements(a) != elements(b)) return std::nullopt;
    ChannelMap map(1);
    if (b.size() == 2 && a.size() > 2) {  // channels → features
      const int64_t per = elements(a) / a[1];
      for (int64_t f = 0; f < b[1]; ++f) map[0].push_back({{0, f / per}});
      return map;
    }
    if (a.size() == 2 && b.size() > 2) {  // features → channels: a channel binds its features
      const int64_t per = elements(b) / b[1];
      for (int64_t c = 0; c < b[1]; ++c) {
        std::vector<ChannelSource> src;
        for (int64_t k = 0; k < per; ++k) src.push_back({0, c * per + k});
        map[0].push_back(std::move(src));
      }
      return map;
    }
    if (a.size() == b.size() && a[1] == b[1] && std::equal(a.begin() + 2, a.end(), b.begin() + 2)) {
      for (int64_t c = 0; c < b[1]; ++c) map[0].push_back({{0, c}});
      return map;
    }
    return std::nullopt;
  };
  r.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    std::vector<int64_t> s{in[0].size(0)};
    const auto& rest = n.attr_ints("shape");
    s.insert(s.end(), rest.begin(), rest.end());
    return one(in[0].reshape(s));
  };
  r.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    if (in[0].empty()) fail(n, "input must have a batch dimension");
    const auto& rest = n.attr_ints("shape");
    int64_t total = 1, known = 1, unknown = -1;
    for (size_t i = 1; i < in[0].size(); ++i) total *= in[0][i];
    Shape out{in[0][0]};
    for (size_t i = 0; i < rest.size(); ++i) {
      if (rest[i] == -1) {
        if (unknown >= 0) fail(n, "more than one -1 in shape");
        unknown = static_cast<int64_t>(i) + 1;
      } else {
        known *= rest[i];
      }
      out.push_back(rest[i]);
    }
    if (unknown >= 0) {
      if (known == 0 || total % known) fail(n, "cannot reshape " + shape_str(in[0]) + " to [N, " + shape_str(rest) + "]");
      out[unknown] = total / known;
    } else if (known != total) {
      fail(n, "cannot reshape " + shape_str(in[0]) + " to [N, " + shape_str(rest) + "]");
    }
    return std::vector<Shape>{out};
  };
  detail::register_builtin(std::move(r));

  auto binary = [](const std::string& kind, const std::string& desc, auto fn) {
    OpTraits b;
    b.integer_inputs = kind == "add";
    b.kind = kind;
    b.description = desc;
    b.channel_flow = ChannelFlow::kElementwise;
    b.min_inputs = b.max_inputs = 2;
    b.forward = [fn](const Node&, const std::vector<at::Tensor>& in, bool) { return one(fn(in[0], in[1])); };
    b.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
      try {
        return std::vector<Shape>{at::infer_size(in[0], in[1])};
      } catch (const std::exception&) {
        fail(n, "shapes " + shape_str(in[0]) + " and " + shape_str(in[1]) + " do not broadcast");
      }
    };
    detail::register_builtin(std::move(b));
  };
  binary("add", "elementwise a + b (broadcasting)", [](const at::Tensor& a, const at::Tensor& b) { return a + b; });
  binary("mul", "elementwise a · b (broadcasting)", [](const at::Tensor& a, const at::Tensor& b) { return a * b; });

  OpTraits c;
  c.kind = "cat";
  c.attributes = {AttrSpec::integer("dim", 1, "the dimension joined along")};
  c.description = "concatenation along dim";
  c.channel_flow = ChannelFlow::kConcat;
  c.integer_inputs = true;
  c.max_inputs = -1;
  c.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) { return one(at::cat(in, n.attr_int("dim"))); };
  c.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    int64_t d = wrap_dim(n, n.attr_int("dim"), in[0].size());
    Shape out = in[0];
    for (size_t i = 1; i < in.size(); ++i) {
      if (in[i].size() != out.size()) fail(n, "inputs have different ranks");
      for (size_t k = 0; k < out.size(); ++k)
        if (static_cast<int64_t>(k) != d && in[i][k] != out[k])
          fail(n, "input " + std::to_string(i) + " has shape " + shape_str(in[i]) + ", incompatible with " + shape_str(in[0]) +
                      " outside dim " + std::to_string(d));
      out[d] += in[i][d];
    }
    return std::vector<Shape>{out};
  };
  detail::register_builtin(std::move(c));

  OpTraits s;
  s.kind = "split";
  s.attributes = {AttrSpec::integer("dim", 1, "the dimension split along"),
                  AttrSpec::needed("split_sizes", AttrType::kInts, "size of each piece, one output each").range(0, std::nullopt)};
  s.description = "split along dim into split_sizes (split/chunk)";
  s.channel_flow = ChannelFlow::kSplit;
  // Pruning removed input channels: each piece along dim 1 keeps the channels kept in its range.
  s.slice_channels = [](Node& n, ChannelRole, const std::vector<int64_t>& keep) {
    if (n.attr_int("dim") != 1) return;
    std::vector<int64_t> sizes = n.attr_ints("split_sizes"), kept(sizes.size(), 0);
    int64_t start = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (int64_t k : keep)
        if (k >= start && k < start + sizes[i]) ++kept[i];
      start += sizes[i];
    }
    n.attrs["split_sizes"] = kept;
  };
  s.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return at::split_with_sizes(in[0], n.attr_ints("split_sizes"), n.attr_int("dim"));
  };
  s.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    int64_t d = wrap_dim(n, n.attr_int("dim"), in[0].size());
    const auto& sizes = n.attr_ints("split_sizes");
    int64_t sum = 0;
    std::vector<Shape> out;
    for (int64_t sz : sizes) {
      Shape o = in[0];
      o[d] = sz;
      out.push_back(o);
      sum += sz;
    }
    if (sum != in[0][d]) fail(n, "split_sizes " + shape_str(sizes) + " do not add up to " + std::to_string(in[0][d]));
    return out;
  };
  detail::register_builtin(std::move(s));

  OpTraits tr;
  tr.kind = "transpose";
  tr.attributes = {AttrSpec::needed("dim0", AttrType::kInt, "first dimension swapped"),
                   AttrSpec::needed("dim1", AttrType::kInt, "second dimension swapped")};
  tr.description = "swaps dims dim0 and dim1";
  tr.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return one(in[0].transpose(n.attr_int("dim0"), n.attr_int("dim1")));
  };
  tr.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    Shape out = in[0];
    std::swap(out[wrap_dim(n, n.attr_int("dim0"), out.size())], out[wrap_dim(n, n.attr_int("dim1"), out.size())]);
    return std::vector<Shape>{out};
  };
  detail::register_builtin(std::move(tr));

  OpTraits pm;
  pm.kind = "permute";
  pm.attributes = {AttrSpec::needed("dims", AttrType::kInts, "the input dimension of each output dimension")};
  pm.description = "permutes dims";
  pm.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) { return one(in[0].permute(n.attr_ints("dims"))); };
  pm.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    const auto& dims = n.attr_ints("dims");
    if (dims.size() != in[0].size()) fail(n, "dims " + shape_str(dims) + " do not match rank " + std::to_string(in[0].size()));
    Shape out;
    for (int64_t d : dims) out.push_back(in[0][wrap_dim(n, d, in[0].size())]);
    return std::vector<Shape>{out};
  };
  detail::register_builtin(std::move(pm));

  OpTraits cs;
  cs.kind = "channel_shuffle";
  cs.attributes = {AttrSpec::needed("groups", AttrType::kInt, "channel groups interleaved").range(1, std::nullopt)};
  cs.description = "ShuffleNet channel shuffle with groups";
  cs.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    const at::Tensor& x = in[0];
    int64_t g = n.attr_int("groups");
    auto s = x.sizes().vec();
    std::vector<int64_t> v{s[0], g, s[1] / g};
    v.insert(v.end(), s.begin() + 2, s.end());
    return one(x.reshape(v).transpose(1, 2).reshape(s));
  };
  // Output channel k·g + i is input channel i·n + k (n = C/g). After pruning the op must still be a
  // shuffle with g groups, which holds exactly when every input group keeps the same positions k:
  // so position k of all g groups is one channel (bound together), on both sides.
  cs.channel_map = [](const Node& n, const std::vector<Shape>& in, const std::vector<Shape>& out) -> std::optional<ChannelMap> {
    const int64_t g = n.attr_int("groups");
    if (in.size() != 1 || out.size() != 1 || in[0].size() < 2 || g < 1 || in[0][1] % g) return std::nullopt;
    const int64_t per = in[0][1] / g;
    ChannelMap map(1);
    for (int64_t j = 0; j < in[0][1]; ++j) {
      const int64_t k = j / g;
      std::vector<ChannelSource> src;
      for (int64_t i = 0; i < g; ++i) src.push_back({0, i * per + k});
      map[0].push_back(std::move(src));
    }
    return map;
  };
  cs.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    int64_t g = n.attr_int("groups");
    if (in[0].size() < 2 || g < 1 || in[0][1] % g) fail(n, "groups=" + std::to_string(g) + " does not divide the channels of " + shape_str(in[0]));
    return std::vector<Shape>{in[0]};
  };
  detail::register_builtin(std::move(cs));

  OpTraits up;
  up.kind = "upsample";
  up.attributes = {AttrSpec::text("mode", "nearest", "interpolation").one_of({"nearest", "bilinear"}),
                   AttrSpec::optional("size", AttrType::kPair, "output height and width").range(1, std::nullopt),
                   AttrSpec::optional("scale_factor", AttrType::kFloats, "output size / input size per axis (when no size)")
                       .range(0, std::nullopt)
                       .length(1, 2),
                   AttrSpec::boolean("align_corners", false, "bilinear: corner pixels aligned")};
  up.description = "2-D upsampling, nearest or bilinear";
  up.channel_flow = ChannelFlow::kPassThrough;
  auto up_size = [](const Node& n, const Shape& in) {
    if (n.has_attr("size")) return n.attr_pair("size");
    if (!n.has_attr("scale_factor")) fail(n, "needs 'size' or 'scale_factor'");
    auto sf = n.attr_floats("scale_factor");
    if (sf.size() == 1) sf.push_back(sf[0]);
    return std::vector<int64_t>{static_cast<int64_t>(std::floor(in[2] * sf[0])), static_cast<int64_t>(std::floor(in[3] * sf[1]))};
  };
  up.forward = [up_size](const Node& n, const std::vector<at::Tensor>& in, bool) {
    auto size = up_size(n, in[0].sizes().vec());
    std::optional<double> sh, sw;
    if (!n.has_attr("size")) {
      auto sf = n.attr_floats("scale_factor");
      sh = sf[0];
      sw = sf.size() > 1 ? sf[1] : sf[0];
    }
    const std::string mode = n.attr_str("mode");
    if (mode == "nearest") return one(at::upsample_nearest2d(in[0], size, sh, sw));
    if (mode == "bilinear") return one(at::upsample_bilinear2d(in[0], size, n.attr_bool("align_corners"), sh, sw));
    fail(n, "unsupported mode '" + mode + "' (nearest, bilinear)");
  };
  up.infer_shapes = [up_size](const Node& n, const std::vector<Shape>& in) {
    require_rank(n, in[0], 4, "4-D NCHW");
    const std::string mode = n.attr_str("mode");
    if (mode != "nearest" && mode != "bilinear") fail(n, "unsupported mode '" + mode + "' (nearest, bilinear)");
    auto s = up_size(n, in[0]);
    return std::vector<Shape>{{in[0][0], in[0][1], s[0], s[1]}};
  };
  detail::register_builtin(std::move(up));

  OpTraits m;
  m.kind = "mean";
  m.attributes = {AttrSpec::needed("dims", AttrType::kInts, "the dimensions averaged over"),
                  AttrSpec::boolean("keepdim", false, "keep them as size 1")};
  m.description = "mean over dims";
  // A mean over dims after the channels (global pooling, squeeze-excitation) keeps channel c.
  m.channel_map = [](const Node& n, const std::vector<Shape>& in, const std::vector<Shape>& out) -> std::optional<ChannelMap> {
    if (in.empty() || in[0].size() < 2 || out.empty() || out[0].size() < 2) return std::nullopt;
    for (int64_t d : n.attr_ints("dims"))
      if (wrap_dim(n, d, in[0].size()) <= 1) return std::nullopt;
    ChannelMap map(1);
    for (int64_t c = 0; c < in[0][1]; ++c) map[0].push_back({{0, c}});
    return map;
  };
  m.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return one(in[0].mean(n.attr_ints("dims"), n.attr_bool("keepdim")));
  };
  m.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    std::vector<bool> reduced(in[0].size(), false);
    for (int64_t d : n.attr_ints("dims")) reduced[wrap_dim(n, d, in[0].size())] = true;
    bool keep = n.attr_bool("keepdim");
    Shape out;
    for (size_t i = 0; i < in[0].size(); ++i) {
      if (!reduced[i]) out.push_back(in[0][i]);
      else if (keep) out.push_back(1);
    }
    return std::vector<Shape>{out};
  };
  detail::register_builtin(std::move(m));
}

// The TorchScript operators each remaining built-in op is read from (the importer decodes their
// arguments), and which ops a sign binarizer commutes with.
void register_torchscript_ops_and_sign(Registry<OpTraits>& reg) {
  const std::map<std::string, std::vector<std::string>> ts = {
      {"add", {"aten::add"}},
      {"mul", {"aten::mul"}},
      {"reshape", {"aten::view", "aten::reshape"}},
      {"split", {"aten::chunk", "aten::unsafe_chunk", "aten::split", "aten::unsafe_split", "aten::split_with_sizes",
                 "aten::unsafe_split_with_sizes"}},
      {"upsample", {"aten::upsample_nearest2d", "aten::upsample_bilinear2d"}},
      // A copy must not alias its source (a later in-place op would change both), so clone becomes
      // an identity node rather than disappearing like contiguous.
      {"identity", {"aten::clone"}},
      {"relu", {"aten::relu"}},
      {"relu6", {"aten::relu6"}},
      {"hardtanh", {"aten::hardtanh"}},  // hardtanh(0, 6) is read as relu6
      {"leaky_relu", {"aten::leaky_relu"}},
      {"sigmoid", {"aten::sigmoid"}},
      {"tanh", {"aten::tanh"}},
      {"silu", {"aten::silu"}},
      {"hardswish", {"aten::hardswish"}},
      {"hardsigmoid", {"aten::hardsigmoid"}},
      {"gelu", {"aten::gelu"}},
      {"dropout", {"aten::dropout"}},
      {"feature_dropout", {"aten::feature_dropout"}},
      {"softmax", {"aten::softmax"}},
      {"max_pool2d", {"aten::max_pool2d"}},
      {"avg_pool2d", {"aten::avg_pool2d"}},
      {"adaptive_avg_pool2d", {"aten::adaptive_avg_pool2d"}},
      {"flatten", {"aten::flatten"}},
      {"cat", {"aten::cat", "aten::concat", "aten::concatenate"}},
      {"transpose", {"aten::transpose"}},
      {"permute", {"aten::permute"}},
      {"mean", {"aten::mean"}},
  };
  for (const auto& [kind, ops] : ts) reg.get_mutable(kind).torchscript_ops = ops;
  for (const char* kind : {"max_pool2d", "flatten", "dropout", "feature_dropout", "identity"})
    reg.get_mutable(kind).commutes_with_sign = true;
}

}  // namespace

namespace detail {
Registry<OpTraits>& builtin_registry();  // op_registry.cpp
}

void register_builtin_ops() {
  register_conv();
  register_batch_norm();
  register_activations();
  register_rprelu();
  register_pooling();
  register_shape_ops();
  register_torchscript_ops_and_sign(detail::builtin_registry());
}

}  // namespace whittle
