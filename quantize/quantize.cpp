#include "quantize/quantize.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "graph/op_registry.h"
#include "graph/pass_registry.h"
#include "graph/select.h"
#include "quantize/pack.h"

namespace whittle::quantize {

namespace {


Granularity node_granularity(const Node& n, Granularity fallback) {
  return n.has_attr("granularity") ? granularity_from_name(n.attr_str("granularity")) : fallback;
}

// Adds the node's attributes to an error message.
[[noreturn]] void node_fail(const Node& n, const std::string& msg) { throw Error("node '" + n.name + "' (" + n.op + "): " + msg); }

// The input a quantizer stage receives: the latent float weight (or a mask's output).
const at::Tensor& latent_weight(const Node& n, const at::Tensor& w, const char* transform) {
  if (!w.defined() || !w.is_floating_point())
    node_fail(n, std::string("weight transform '") + transform + "' needs a float 'weight' parameter");
  return w;
}

void register_ops() {
  OpTraits aq;
  aq.kind = "act_quant";
  aq.description =
      "activation quantizer: method dorefa (c·quantize_k(clip(x, 0, c)/c), activation_bits, activation_clip c, default 1; "
      "relu 1: stands for a ReLU then the quantizer, same values, gradient 0 at x = 0) or sign (BNN binarizer)";
  aq.channel_flow = ChannelFlow::kPassThrough;
  aq.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    const std::string method = n.attr_str("method", "dorefa");
    if (method == "sign") return std::vector<at::Tensor>{bnn_sign(in[0])};
    if (method == "dorefa") return std::vector<at::Tensor>{
          dorefa_activation(in[0], n.attr_int("activation_bits"), n.attr_float("activation_clip", 1.0),
                            n.attr_int("relu", 0) != 0)};
    node_fail(n, "unknown activation quantizer method '" + method + "' (dorefa, sign)");
  };
  aq.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    const std::string method = n.attr_str("method", "dorefa");
    if (method != "sign" && method != "dorefa") node_fail(n, "unknown activation quantizer method '" + method + "' (dorefa, sign)");
    if (method == "dorefa") {
      const int64_t k = n.attr_int("activation_bits");
      if (!((k >= 1 && k <= 8) || k == 32)) node_fail(n, "activation_bits " + std::to_string(k) + " (1..8 or 32)");
      const double clip = n.attr_float("activation_clip", 1.0);
      if (!(clip > 0) || !std::isfinite(clip))
        node_fail(n, "activation_clip " + std::to_string(clip) + " (a finite value > 0)");
    }
    return std::vector<Shape>{in[0]};
  };
  register_op(std::move(aq));

  OpTraits xs;
  xs.kind = "xnor_scale";
  xs.description = "XNOR-Net activation scale K: avg_pool(mean_c |x|) over the layer's window ([N,1,Ho,Wo]; [N,1] for features)";
  xs.channel_flow = ChannelFlow::kOpaque;
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

void register_transforms() {
  auto quantizer = [](const char* name, const char* description, std::vector<std::string> attributes,
                      std::function<at::Tensor(const Node&, const at::Tensor&)> f) {
    WeightTransform t;
    t.name = name;
    t.description = description;
    t.kind = TransformKind::kQuantizer;
    t.attributes = std::move(attributes);
    t.apply = [f, name](const Node& n, const at::Tensor& w, bool) { return f(n, latent_weight(n, w, name)); };
    register_weight_transform(std::move(t));
  };
  quantizer("dorefa", "DoReFa weights (weight_bits 1..8)", {"weight_bits", "weight_axis", "granularity"},
            [](const Node& n, const at::Tensor& w) {
              return dorefa_weight(w, n.attr_int("weight_bits"), node_granularity(n, Granularity::kPerTensor),
                                   n.attr_int("weight_axis", 0));
            });
  quantizer("twn", "TWN ternary weights", {"weight_bits", "weight_axis", "granularity"},
            [](const Node& n, const at::Tensor& w) {
              return twn_weight(w, node_granularity(n, Granularity::kPerChannel), n.attr_int("weight_axis", 0));
            });
  quantizer("bnn", "BNN sign weights", {"weight_bits", "weight_axis"},
            [](const Node&, const at::Tensor& w) { return bnn_sign(w); });
  quantizer("xnor", "XNOR-Net weights α·sign(W)", {"weight_bits", "weight_axis", "granularity", "xnor_detach_alpha"},
            [](const Node& n, const at::Tensor& w) {
              return xnor_weight(w, n.attr_int("xnor_detach_alpha", 0) != 0, node_granularity(n, Granularity::kPerChannel),
                                 n.attr_int("weight_axis", 0));
            });
  WeightTransform packed;
  packed.name = "packed";
  packed.description = "packed integer codes and scales of a checkpoint";
  packed.kind = TransformKind::kDecode;
  packed.attributes = {"quant_method", "weight_encoding", "weight_bits", "weight_shape", "weight_axis"};
  packed.buffers = {"weight_codes", "weight_scale"};
  packed.apply = [](const Node& n, const at::Tensor&, bool) { return decode_packed_weight(n); };
  register_weight_transform(std::move(packed));
}

// True for the stacks a quantizer may join: no quantizer or decoder yet.
std::string quantizer_stack_problem(const Node& n) {
  for (const auto& t : n.weight_transforms) {
    const TransformKind k = weight_transform(t).kind;
    if (k == TransformKind::kQuantizer || k == TransformKind::kDecode) return "already has weight transform '" + t + "'";
  }
  return "";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}


Node make_node(const std::string& name, const std::string& op, std::vector<std::string> inputs,
               std::map<std::string, Attr> attrs) {
  Node n;
  n.name = name;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  return n;
}

}  // namespace

void register_passes() {
  register_pass({"quantize", "quantize",
                 "quantization-aware training: quantizers on weights (transform stack) and activations (act_quant)",
                 {{"method", "string", "dorefa", "dorefa (Zhou et al. 2016), twn (Li et al. 2016), bnn (Courbariaux et al. "
                                                  "2016) or xnor (Rastegari et al. 2016)"},
                  {"weight_bits", "int", "0 (the method's default)", "dorefa 1..8 or 32, twn 2, bnn/xnor 1 or 32"},
                  {"activation_bits", "int", "0 (the method's default)", "dorefa/twn 1..8 or 32, bnn/xnor 1 or 32"},
                  {"activation_clip", "float", "1", "DoReFa activation clip level c"},
                  {"targets", "list", "", "layers to quantize (naming the first or last layer quantizes it)"},
                  {"ignore", "list", "", "layers to leave in full precision"}},
                 [](Graph& g, const PassOptionValues& v) {
                   Config c;
                   c.method = pass_option_string(v, "method", c.method);
                   c.weight_bits = pass_option_int(v, "weight_bits", c.weight_bits);
                   c.activation_bits = pass_option_int(v, "activation_bits", c.activation_bits);
                   c.activation_clip = pass_option_float(v, "activation_clip", c.activation_clip);
                   c.targets = pass_option_list(v, "targets");
                   c.ignore = pass_option_list(v, "ignore");
                   return apply(g, c).summary();
                 }});
}

void register_all() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_ops();
    register_transforms();
    register_passes();
  });
}

WHITTLE_REGISTER_MODULE("quantize", &register_all)

std::string Report::summary() const {
  std::ostringstream os;
  os << "quantized " << quantized.size() << " layers" << (quantized.empty() ? "" : ": " + join(quantized)) << "\n";
  if (!inserted.empty()) os << "inserted: " << join(inserted) << "\n";
  if (!replaced.empty()) os << "ReLU replaced by its activation quantizer: " << join(replaced) << "\n";
  for (const auto& s : skipped) os << "skipped " << s << "\n";
  return os.str();
}

Config resolve(const Config& in) {
  Config c = in;
  auto bad = [&](const std::string& key, int64_t v, const std::string& allowed) {
    throw Error("quantize: " + key + " = " + std::to_string(v) + " is not supported by method '" + c.method + "' (" + allowed + ")");
  };
  auto dorefa_bits = [](int64_t k) { return (k >= 1 && k <= 8) || k == 32; };
  if (c.method == "dorefa") {
    if (c.weight_bits == 0) c.weight_bits = 8;
    if (c.activation_bits == 0) c.activation_bits = 8;
    if (!dorefa_bits(c.weight_bits)) bad("weight_bits", c.weight_bits, "1..8 or 32");
    if (!dorefa_bits(c.activation_bits)) bad("activation_bits", c.activation_bits, "1..8 or 32");
    if (!c.granularity) c.granularity = Granularity::kPerTensor;
  } else if (c.method == "twn") {
    if (c.weight_bits == 0) c.weight_bits = 2;
    if (c.activation_bits == 0) c.activation_bits = 32;
    if (c.weight_bits != 2) bad("weight_bits", c.weight_bits, "2: ternary");
    if (!dorefa_bits(c.activation_bits)) bad("activation_bits", c.activation_bits, "1..8 or 32");
    if (!c.granularity) c.granularity = Granularity::kPerChannel;
  } else if (c.method == "bnn" || c.method == "xnor") {
    if (c.weight_bits == 0) c.weight_bits = 1;
    if (c.activation_bits == 0) c.activation_bits = 1;
    if (c.weight_bits != 1 && c.weight_bits != 32) bad("weight_bits", c.weight_bits, "1 or 32");
    if (c.activation_bits != 1 && c.activation_bits != 32) bad("activation_bits", c.activation_bits, "1 or 32");
    if (!c.granularity) c.granularity = c.method == "xnor" ? Granularity::kPerChannel : Granularity::kPerTensor;
  } else {
    throw Error("quantize: unknown method '" + c.method + "' (dorefa, twn, bnn, xnor)");
  }
  if (c.xnor_scale_k && c.method != "xnor") throw Error("quantize: xnor_scale_k applies to method 'xnor' only");
  if (!(c.activation_clip > 0) || !std::isfinite(c.activation_clip))
    throw Error("quantize: activation_clip = " + std::to_string(c.activation_clip) + " (expected a finite value > 0)");
  if (c.activation_clip != 1.0 && (c.method == "bnn" || c.method == "xnor" || c.activation_bits == 32))
    throw Error("quantize: activation_clip applies to DoReFa activations only (method dorefa or twn with activation_bits "
                "1..8), not to method '" + c.method + "' with activation_bits " + std::to_string(c.activation_bits));
  return c;
}

Report apply(Graph& graph, const Config& config_in) {
  register_all();
  const Config c = resolve(config_in);
  Report report;

  // 1. Collect the layers to quantize, in graph order.
  std::vector<std::string> layers;
  for (const auto& n : graph.nodes())
    if (is_weighted_layer(n)) layers.push_back(n.name);  // the registry says which ops are layers
  if (layers.empty()) return report;
  const std::set<std::string> named(c.targets.begin(), c.targets.end());
  std::vector<std::string> chosen;
  for (const auto& name : select_nodes(graph, c.targets, c.ignore)) {
    const Node& n = graph.node(name);
    if (!is_weighted_layer(n)) continue;
    if ((name == layers.front() || name == layers.back()) && !named.count(name)) {
      report.skipped.push_back(name + ": first or last layer stays in full precision (name it in targets to quantize it)");
      continue;
    }
    if (std::string why = quantizer_stack_problem(n); !why.empty()) {
      report.skipped.push_back(name + ": " + why);
      continue;
    }
    chosen.push_back(name);
  }
  const bool quant_weights = c.weight_bits != 32;
  const bool quant_acts = c.activation_bits != 32;
  if (!quant_weights && !quant_acts) return report;

  // 2. Weights: attributes only; the transform runs in GraphModule's forward.
  if (quant_weights) {
    for (const auto& name : chosen) {
      Node& n = graph.node(name);
      push_weight_transform(n, c.method);
      n.attrs["weight_bits"] = c.method == "twn" ? int64_t{2} : c.weight_bits;
      n.attrs["weight_axis"] = weight_output_axis(n).value_or(0);
      if (c.method != "bnn") n.attrs["granularity"] = std::string(granularity_name(*c.granularity));
      if (c.method == "xnor") n.attrs["xnor_detach_alpha"] = int64_t{c.xnor_detach_alpha ? 1 : 0};
    }
  }

  // 3. Activations: one quantizer per distinct input value, shared by the layers reading it.
  const bool binary = quant_acts && (c.method == "bnn" || c.method == "xnor");
  const std::set<std::string> chosen_set(chosen.begin(), chosen.end());
  std::map<std::string, std::string> quantized_value;  // original input value → quantized value
  std::map<std::string, std::string> real_source;      // layer → real-valued value its binary input comes from ("" unknown)
  if (quant_acts) {
    for (const auto& name : chosen) {
      const std::string v = graph.node(name).inputs.at(0);
      auto done = quantized_value.find(v);
      if (done != quantized_value.end()) {
        graph.node(name).inputs[0] = done->second;
        real_source[name] = real_source[done->first];
        continue;
      }
      if (!binary) {
        // A ReLU whose every use is a layer quantized here becomes the quantizer itself (relu = 1):
        // the same values and gradients as ReLU then quantizer, one pass fewer each way.
        const ValueInfo& vi = graph.value(v);
        if (!vi.producer.empty() && graph.node(vi.producer).op == "relu" && !graph.is_output(v)) {
          bool only_quantized_layers = true;
          for (const auto& u : graph.users(v)) {
            const Node& un = graph.node(u);
            if (!chosen_set.count(u) || un.inputs.at(0) != v ||
                std::count(un.inputs.begin(), un.inputs.end(), v) != 1)
              only_quantized_layers = false;
          }
          if (only_quantized_layers) {
            Node& r = graph.node(vi.producer);
            r.op = "act_quant";
            r.attrs = {{"method", std::string("dorefa")}, {"activation_bits", c.activation_bits}, {"relu", int64_t{1}}};
            if (c.activation_clip != 1.0) r.attrs["activation_clip"] = c.activation_clip;
            report.replaced.push_back(r.name);
            quantized_value[v] = v;
            continue;
          }
        }
        Node q = make_node(graph.unique_name(name + ".act_quant"), "act_quant", {v},
                           {{"method", std::string("dorefa")}, {"activation_bits", c.activation_bits}});
        if (c.activation_clip != 1.0) q.attrs["activation_clip"] = c.activation_clip;
        const std::string out = graph.insert_node_before(name, q);
        report.inserted.push_back(q.name);
        quantized_value[v] = out;
        graph.node(name).inputs[0] = out;
        continue;
      }
      // Binary: find the ReLU feeding the layer, possibly through sign-commuting single-use ops.
      std::string cur = v;
      std::vector<std::string> chain;
      while (true) {
        const ValueInfo& vi = graph.value(cur);
        if (vi.producer.empty()) break;
        const Node& p = graph.node(vi.producer);
        // Ops through which sign(relu input) may stand in for the ReLU (OpTraits::commutes_with_sign).
        if (!op_traits(p.op).commutes_with_sign || p.inputs.size() != 1 || graph.users(cur).size() != 1 || graph.is_output(cur)) break;
        chain.push_back(p.name);
        cur = p.inputs[0];
      }
      const ValueInfo& ci = graph.value(cur);
      const Node* relu = ci.producer.empty() ? nullptr : &graph.node(ci.producer);
      if (relu && relu->op != "relu" && relu->op != "relu6") relu = nullptr;
      if (relu && !graph.is_output(cur)) {
        // Every use of the ReLU must be a binarized layer, or the chain leading to this layer.
        bool all_binarized = true;
        for (const auto& u : graph.users(cur))
          if (!chosen_set.count(u) && (chain.empty() || u != chain.back())) all_binarized = false;
        if (all_binarized) {
          Node& r = graph.node(relu->name);
          const std::string source = r.inputs[0];
          r.op = "act_quant";
          r.attrs = {{"method", std::string("sign")}, {"activation_bits", int64_t{1}}};
          report.replaced.push_back(r.name);
          quantized_value[v] = v;
          quantized_value[cur] = cur;
          real_source[name] = chain.empty() ? source : "";
          continue;
        }
        if (chain.empty()) {
          const std::string source = relu->inputs[0];
          Node q = make_node(graph.unique_name(name + ".act_quant"), "act_quant", {source},
                             {{"method", std::string("sign")}, {"activation_bits", int64_t{1}}});
          const std::string out = graph.insert_node_before(name, q);
          report.inserted.push_back(q.name);
          quantized_value[v] = out;
          graph.node(name).inputs[0] = out;
          real_source[name] = source;
          continue;
        }
      }
      Node q = make_node(graph.unique_name(name + ".act_quant"), "act_quant", {v},
                         {{"method", std::string("sign")}, {"activation_bits", int64_t{1}}});
      const std::string out = graph.insert_node_before(name, q);
      report.inserted.push_back(q.name);
      quantized_value[v] = out;
      graph.node(name).inputs[0] = out;
      real_source[name] = v;
    }
  }

  // 4. XNOR-Net K: the layer's output times K computed from its real-valued input.
  if (binary && c.xnor_scale_k) {
    for (const auto& name : chosen) {
      const std::string src = real_source[name];
      const Node& n = graph.node(name);
      if (src.empty() || n.op == "conv_transpose2d" ||
          (n.op == "conv2d" && (n.attr_ints("dilation", {1, 1}) != std::vector<int64_t>{1, 1} || n.attr_int("groups", 1) != 1))) {
        report.skipped.push_back(name + ": no XNOR K scale (input pooled after the ReLU, transposed, dilated or grouped)");
        continue;
      }
      std::map<std::string, Attr> attrs;
      if (n.op == "conv2d") {
        const auto w = n.params.at("weight").sizes();
        attrs = {{"kernel_size", std::vector<int64_t>{w[2], w[3]}}, {"stride", n.attr_pair("stride", 1)},
                 {"padding", n.attr_pair("padding", 0)}};
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

  for (const auto& name : chosen) report.quantized.push_back(name);
  graph.infer_shapes();
  graph.validate();
  return report;
}

Report apply(GraphModule& module, const Config& config) {
  return run_on_module(module, "quantize", ModuleMode::kAny, [&](Graph& g) { return apply(g, config); });
}

int64_t clip_latent_weights(Graph& graph) {
  at::NoGradGuard no_grad;
  int64_t count = 0;
  for (auto& n : graph.nodes()) {
    if (!has_weight_transform(n, "bnn")) continue;
    if (at::Tensor* w = n.params.find("weight"); w && w->defined()) {
      w->clamp_(-1.0, 1.0);
      ++count;
    }
  }
  return count;
}

int64_t storage_bits(int64_t bits) {
  if (bits <= 1) return 1;
  if (bits == 2) return 2;
  if (bits <= 4) return 4;
  return 8;
}

bool has_quantized_weight(const Node& n) {
  // The stack must end in a quantizer with only masks before it (they are baked into the codes);
  // a fold (QAT BN) changes the weight with training-time statistics and is never packed.
  const auto& s = n.weight_transforms;
  if (s.empty() || weight_transform(s.back()).kind != TransformKind::kQuantizer) return false;
  const std::string& t = s.back();
  if (t != "dorefa" && t != "twn" && t != "bnn" && t != "xnor") return false;
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (weight_transform(s[i]).kind != TransformKind::kMask) return false;
  const at::Tensor* w = n.params.find("weight");
  return w && w->defined() && at::isFloatingType(w->scalar_type());
}

EncodedWeight encode_node_weight(const Node& n) {
  if (!has_quantized_weight(n)) node_fail(n, "has no quantized weight to encode");
  const std::string t = n.weight_transforms.back();
  at::Tensor w = n.params.at("weight");
  if (n.weight_transforms.size() > 1) {
    at::NoGradGuard no_grad;
    w = transformed_weight(n, false, n.weight_transforms.size() - 1);  // the masks' output
  }
  const int64_t axis = n.attr_int("weight_axis", 0);
  if (t == "dorefa") return dorefa_encode(w, n.attr_int("weight_bits"), node_granularity(n, Granularity::kPerTensor), axis);
  if (t == "twn") return twn_encode(w, node_granularity(n, Granularity::kPerChannel), axis);
  if (t == "bnn") return bnn_encode(w, axis);
  return xnor_encode(w, node_granularity(n, Granularity::kPerChannel), axis);
}

std::optional<WeightQuantization> weight_quantization(const Node& n) {
  WeightQuantization q;
  if (n.weight_transforms.size() == 1 && n.weight_transforms[0] == "packed") {
    const at::Tensor* scale = n.buffers.find("weight_scale");
    if (!scale || !scale->defined() || !n.has_attr("weight_bits") || !n.has_attr("weight_encoding"))
      node_fail(n, "packed weight needs buffer 'weight_scale' and attributes weight_bits and weight_encoding");
    q.method = n.attr_str("quant_method", "");
    q.encoding = encoding_from_name(n.attr_str("weight_encoding"));
    q.bits = n.attr_int("weight_bits");
    q.axis = n.attr_int("weight_axis", 0);
    q.scale = *scale;
    return q;
  }
  if (!has_quantized_weight(n)) return std::nullopt;
  EncodedWeight e = encode_node_weight(n);
  q.method = n.weight_transforms.back();
  q.encoding = e.encoding;
  q.bits = e.bits;
  q.axis = e.axis;
  q.scale = e.scale;
  return q;
}

Graph pack_graph(const Graph& graph) {
  register_all();
  Graph out = graph.clone(/*clone_tensors=*/false);
  for (auto& n : out.nodes()) {
    if (!has_quantized_weight(n)) continue;
    const at::Tensor w = n.params.at("weight");
    EncodedWeight e = encode_node_weight(n);
    n.params.erase("weight");
    n.buffers.set("weight_codes", pack_codes(e.codes, storage_bits(e.bits)));
    n.buffers.set("weight_scale", e.scale.detach().to(at::kFloat).contiguous());
    n.attrs["quant_method"] = n.weight_transforms.back();
    // The masks are in the codes now; the decoder replaces the whole stack.
    for (size_t i = 0; i + 1 < n.weight_transforms.size(); ++i)
      for (const auto& b : weight_transform(n.weight_transforms[i]).buffers) n.buffers.erase(b);
    n.weight_transforms = {"packed"};
    n.attrs["weight_encoding"] = std::string(encoding_name(e.encoding));
    n.attrs["weight_bits"] = e.bits;
    n.attrs["weight_shape"] = w.sizes().vec();
    n.attrs["weight_axis"] = e.axis;
  }
  return out;
}

at::Tensor decode_packed_weight(const Node& n) {
  const at::Tensor* codes = n.buffers.find("weight_codes");
  const at::Tensor* scale = n.buffers.find("weight_scale");
  if (!codes || !scale || !codes->defined() || !scale->defined())
    node_fail(n, "packed weight needs buffers 'weight_codes' and 'weight_scale'");
  if (!n.has_attr("weight_shape") || !n.has_attr("weight_bits") || !n.has_attr("weight_encoding"))
    node_fail(n, "packed weight needs attributes weight_shape, weight_bits and weight_encoding");
  const Shape shape = n.attr_ints("weight_shape");
  const int64_t bits = n.attr_int("weight_bits");
  const Encoding enc = encoding_from_name(n.attr_str("weight_encoding"));
  const int64_t axis = n.attr_int("weight_axis", 0);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  try {
    at::Tensor c = unpack_codes(*codes, storage_bits(bits), count).reshape(shape);
    const at::ScalarType dtype = at::isFloatingType(scale->scalar_type()) ? scale->scalar_type() : at::kFloat;
    return decode_weight(c, *scale, enc, bits, axis, dtype);
  } catch (const Error& e) {
    node_fail(n, std::string("packed weight: ") + e.what());
  }
}

}  // namespace whittle::quantize
