// XNOR-Net (Rastegari et al., 2016, arXiv:1603.05279): the weight quantizer "xnor" (α_c·sign(W_c),
// α_c = mean|W_c|), the op "xnor_scale" (the activation scale K) and the method "xnor": XNOR
// weights, sign activations (the BNN binarizer) and, optionally, each binarized layer's output
// times K. The math is in quantizers.h.

#include <ATen/ATen.h>

#include "core/error.h"
#include "graph/op_registry.h"
#include "quantize/binary.h"

namespace whittle::quantize {

namespace {

// The XNOR-Net options a recipe or Config may give.
struct XnorOptions : BinaryOptions {
  /// Where α = mean|W| is computed (unset: per_channel, the paper's).
  std::optional<std::string> granularity;
  /// No gradient through α = mean|W|.
  bool xnor_detach_alpha = false;
  /// Scale each binarized layer's output by K, computed from its real-valued input.
  bool xnor_scale_k = false;
};

const OptionsSchema<XnorOptions>& xnor_schema() {
  using O = XnorOptions;
  static const OptionsSchema<O> schema = [] {
    OptionsSchema<O> s;
    s.add("granularity", &O::granularity, "where the scale α (the mean absolute weight) is computed", {"per_tensor", "per_channel"},
          "per_channel")
        .add("xnor_detach_alpha", &O::xnor_detach_alpha, "no gradient through α (the mean absolute weight)")
        .add("xnor_scale_k", &O::xnor_scale_k, "scale each binarized layer's output by K");
    return add_binary_keys(s);
  }();
  return schema;
}

class XnorMethod final : public BinaryMethod<XnorOptions> {
 public:
  std::string name() const override { return "xnor"; }
  std::string description() const override {
    return "XNOR-Net (Rastegari et al. 2016): α·sign(W) weights with α per output channel, sign activations, "
           "optional activation scale K";
  }
  void attach_weight(Node& n, const Config& c) const override {
    const XnorOptions o = options(c);
    n.attrs["weight_bits"] = c.weight_bits;
    n.attrs["weight_axis"] = weight_output_axis(n).value_or(0);
    n.attrs["granularity"] = o.granularity.value_or("per_channel");
    n.attrs["xnor_detach_alpha"] = int64_t{o.xnor_detach_alpha ? 1 : 0};
    attach_binary_weight(n, o);
  }
  // K: the layer's output times K computed from its real-valued input.
  void finish(Graph& graph, const Config& c, const std::vector<std::string>& layers, const RealSources& real_sources,
              Report& report) const override {
    BinaryMethod<XnorOptions>::finish(graph, c, layers, real_sources, report);  // RSign's shifts
    if (!options(c).xnor_scale_k || c.activation_bits == 32) return;
    for (const auto& name : layers) {
      auto found = real_sources.find(name);
      const std::string src = found == real_sources.end() ? "" : found->second;
      const Node& n = graph.node(name);
      if (src.empty() || n.op == "conv_transpose2d" ||
          (n.op == "conv2d" && (n.attr_pair("dilation") != std::vector<int64_t>{1, 1} || n.attr_int("groups") != 1))) {
        report.skipped.push_back(name + ": no XNOR K scale (input pooled after the ReLU, transposed, dilated or grouped)");
        continue;
      }
      std::map<std::string, Attr> attrs;
      if (n.op == "conv2d") {
        const auto w = n.params.at("weight").sizes();
        attrs = {{"kernel_size", std::vector<int64_t>{w[2], w[3]}}, {"stride", n.attr_pair("stride")},
                 {"padding", n.attr_pair("padding")}};
      }
      Node k = make_node(graph.unique_name(name + ".xnor_scale"), "xnor_scale", {src}, attrs);
      graph.insert_node_before(name, k);
      const size_t at = graph.node_index(name);
      Node m = make_node(graph.unique_name(name + ".xnor_mul"), "mul", {name, k.name}, {});
      const std::string mul_name = m.name;
      if (at + 1 < graph.nodes().size()) graph.insert_node_before(graph.nodes()[at + 1].name, m);
      else graph.add_node(m);
      graph.replace_all_uses(name, mul_name, mul_name);
      report.inserted.push_back(k.name);
      report.inserted.push_back(mul_name);
    }
  }
  std::string label(const Config&) const override { return "XNOR-Net"; }

 protected:
  const OptionsSchema<XnorOptions>& schema() const override { return xnor_schema(); }
};

void register_xnor_scale_op() {
  OpTraits xs;
  xs.kind = "xnor_scale";
  xs.description = "XNOR-Net activation scale K: avg_pool(mean_c |x|) over the layer's window ([N,1,Ho,Wo]; [N,1] for features)";
  xs.channel_flow = ChannelFlow::kOpaque;
  // A linear layer's K (input [N, F]) has no window.
  xs.attributes = {AttrSpec::optional("kernel_size", AttrType::kInts, "the layer's kernel (conv2d)").range(1, std::nullopt).length(2, 2),
                   AttrSpec::optional("stride", AttrType::kInts, "the layer's stride (conv2d)").range(1, std::nullopt).length(2, 2),
                   AttrSpec::optional("padding", AttrType::kInts, "the layer's padding (conv2d)").range(0, std::nullopt).length(2, 2)};
  xs.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    if (in[0].dim() == 2) return std::vector<at::Tensor>{xnor_activation_scale(in[0], {}, {}, {})};
    return std::vector<at::Tensor>{xnor_activation_scale(in[0], n.attr_ints("kernel_size"), n.attr_ints("stride"),
                                                         n.attr_ints("padding"))};
  };
  xs.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    if (in[0].size() == 2) return std::vector<Shape>{{in[0][0], 1}};
    if (in[0].size() != 4) node_fail(n, "expects [N, C, H, W] or [N, F], got " + shape_str(in[0]));
    const auto& k = n.attr_ints("kernel_size");
    const auto& s = n.attr_ints("stride");
    const auto& p = n.attr_ints("padding");
    if (k.size() != 2 || s.size() != 2 || p.size() != 2) node_fail(n, "kernel_size, stride and padding need 2 values");
    Shape out{in[0][0], 1, (in[0][2] + 2 * p[0] - k[0]) / s[0] + 1, (in[0][3] + 2 * p[1] - k[1]) / s[1] + 1};
    return std::vector<Shape>{out};
  };
  register_op(std::move(xs));
}

}  // namespace

void register_xnor() {
  WeightQuantizer w;
  w.name = "xnor";
  w.description = "XNOR-Net weights α·sign(W) (Rastegari et al. 2016), α = mean|W| per output channel or tensor";
  w.attributes = weight_quantizer_attributes(1, 1);
  w.attributes.push_back(granularity_attribute(Granularity::kPerChannel));
  w.attributes.push_back(AttrSpec::boolean("xnor_detach_alpha", false, "no gradient through the scale α"));
  for (AttrSpec& a : binary_weight_attributes()) w.attributes.push_back(std::move(a));
  w.forward = [](const Node& n, const at::Tensor& w, bool) {
    const at::Tensor v = binary_weight_input(n, w);
    const int64_t axis = n.attr_int("weight_axis");
    if (n.attr_str("sign_gradient") == "ste")
      return xnor_weight(v, n.attr_bool("xnor_detach_alpha"), node_granularity(n), axis);
    // α·sign(v) with the layer's sign gradient: α = mean|v| as xnor_encode computes it.
    const at::Tensor a = n.attr_bool("xnor_detach_alpha") ? v.detach() : v;
    at::Tensor alpha = node_granularity(n) == Granularity::kPerTensor
                           ? a.abs().mean().reshape({1})
                           : a.abs().movedim(axis, 0).reshape({a.size(axis), -1}).mean(1);
    std::vector<int64_t> shape(static_cast<size_t>(v.dim()), 1);
    shape[static_cast<size_t>(axis)] = alpha.numel();
    return node_sign(n, v) * alpha.reshape(shape);
  };
  w.encode = [](const Node& n, const at::Tensor& w) {
    return xnor_encode(binary_weight_input(n, w), node_granularity(n), n.attr_int("weight_axis"));
  };
  // α·(2c − 1): q = ±1 times the per-channel α.
  w.integer_grid = [](const EncodedWeight& e, const Shape& shape) -> std::optional<IntegerGrid> {
    if (e.encoding != Encoding::kSign) return std::nullopt;
    return channel_grid(e, shape);
  };
  register_weight_quantizer(std::move(w));
  register_xnor_scale_op();
  register_quantizer_method(std::make_unique<XnorMethod>());
}

}  // namespace whittle::quantize
