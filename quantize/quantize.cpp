#include "quantize/quantize.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "graph/op_registry.h"
#include "graph/pass_registry.h"
#include "graph/select.h"
#include "quantize/binary.h"
#include "quantize/method.h"
#include "quantize/pack.h"

namespace whittle::quantize {

namespace {

// While set (initialize_learned), act_quant nodes whose quantizer initializes from data (and that
// are among t_initialize_only, when it is not empty) do so from the input of each forward, and
// count themselves here.
thread_local int64_t* t_initialized = nullptr;
thread_local const std::set<std::string>* t_initialize_only = nullptr;
// While set (calibrate_learned), the act_quant nodes named here add their input to their histogram
// and pass it on unquantized (after the ReLU they stand for).
thread_local std::map<std::string, Histogram>* t_observed = nullptr;

void register_ops() {
  OpTraits aq;
  aq.kind = "act_quant";
  aq.description =
      "activation quantizer: attribute method names an activation quantizer (whittle inspect --activation-quantizers: "
      "dorefa, sign, ...), which reads the node's other attributes";
  aq.channel_flow = ChannelFlow::kPassThrough;
  aq.attributes = {AttrSpec::text("method", "dorefa", "the activation quantizer (graphs before methods had names: dorefa)")
                       .checked([](const Node&, const Attr& v) -> std::string {
                         const std::string& name = std::get<std::string>(v);
                         if (activation_quantizers().find(name)) return "";
                         std::string known;
                         for (const auto& k : activation_quantizers().names()) known += (known.empty() ? "" : ", ") + k;
                         return "is '" + name + "', not a registered activation quantizer (" + known + ")";
                       })};
  aq.node_attributes = [](const Node& n) -> const std::vector<AttrSpec>* {
    const ActivationQuantizer* q = activation_quantizers().find(n.attr_str("method"));
    return q ? &q->attributes : nullptr;
  };
  aq.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool training) {
    const ActivationQuantizer& q = activation_quantizer_of(n);
    if (t_observed) {
      auto it = t_observed->find(n.name);
      if (it != t_observed->end()) {
        // What the layer reads: after the ReLU the node stands for.
        const at::Tensor x = q.grid(n).relu ? at::relu(in[0]) : in[0];
        observe(it->second, x, "node '" + n.name + "' (act_quant): calibration input");
        return std::vector<at::Tensor>{x};
      }
    }
    if (t_initialized && q.initialize && (!t_initialize_only || t_initialize_only->empty() || t_initialize_only->count(n.name))) {
      // From what the layer reads: after the ReLU the node stands for.
      q.initialize(n, q.grid(n).relu ? at::relu(in[0]) : in[0]);
      ++*t_initialized;
    }
    return std::vector<at::Tensor>{q.forward(n, in[0], training)};
  };
  aq.infer_shapes = [](const Node& n, const std::vector<Shape>& in) {
    activation_quantizer_of(n).check(n);
    return std::vector<Shape>{in[0]};
  };
  // The quantizer's per-channel parameters (RSign's shift) go with the channels they belong to.
  aq.channel_tensors = [](const Node& n) {
    const ActivationQuantizer& q = activation_quantizer_of(n);
    return q.channel_tensors ? q.channel_tensors(n) : std::vector<ChannelTensor>{};
  };
  aq.quantizer_params = [](const Node& n) { return activation_quantizer_of(n).params; };
  aq.binarizes = [](const Node& n) { return activation_quantizer_of(n).grid(n).sign; };
  aq.sign_shift = [](const Node& n) {
    const ActivationQuantizer& q = activation_quantizer_of(n);
    return q.sign_shift ? q.sign_shift(n) : at::Tensor();
  };
  register_op(std::move(aq));
}

void register_transforms() {
  WeightTransform packed;
  packed.name = "packed";
  packed.description = "packed integer codes and scales of a checkpoint";
  packed.kind = TransformKind::kDecode;
  packed.attributes = {
      AttrSpec::text("quant_method", "", "the weight quantizer that wrote the codes (\"\": decoded by weight_encoding)")
          .checked([](const Node&, const Attr& v) -> std::string {
            const std::string& name = std::get<std::string>(v);
            return name.empty() || weight_quantizers().find(name) ? "" : "is '" + name + "', not a registered weight quantizer";
          }),
      AttrSpec::needed("weight_encoding", AttrType::kString, "how codes map to values").one_of(encoding_names()),
      AttrSpec::needed("weight_bits", AttrType::kInt, "bits per code").range(1, 8),
      AttrSpec::needed("weight_shape", AttrType::kInts, "the decoded weight's shape").range(0, std::nullopt).length(1, 8),
      AttrSpec::integer("weight_axis", 0, "the axis of the per-channel scales").range(0, 7)};
  // The attributes of the quantizer that wrote the codes (its granularity, ...) stay with them.
  packed.node_attributes = [](const Node& n) -> const std::vector<AttrSpec>* {
    const auto it = n.attrs.find("quant_method");
    if (it == n.attrs.end() || !std::holds_alternative<std::string>(it->second)) return nullptr;
    const WeightQuantizer* q = weight_quantizers().find(std::get<std::string>(it->second));
    return q ? &q->attributes : nullptr;
  };
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

// The pass's own keys; the methods' keys go to Config::options.
const OptionsSchema<Config>& pass_schema() {
  static const auto schema =
      OptionsSchema<Config>()
          .add("method", &Config::method, "a quantizer method (whittle inspect --methods)")
          .add("weight_bits", &Config::weight_bits, "weight bits the method supports", {}, "the method's default")
          .in_range(Range::at_least(0))
          .add("activation_bits", &Config::activation_bits, "activation bits the method supports", {}, "the method's default")
          .in_range(Range::at_least(0))
          .add("targets", &Config::targets, "layers to quantize (naming the first or last layer quantizes it)")
          .add("ignore", &Config::ignore, "layers to leave in full precision");
  return schema;
}

}  // namespace

void register_passes() {
  std::vector<KeySpec> options = pass_schema().keys();
  const size_t common = options.size();
  // The methods' own options (those registered so far), each once, for Config::options: named
  // with the methods that have it ("dorefa, twn: ..."), the default per method where they differ.
  std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> owners;  // methods, defaults
  for (const auto& name : quantizer_methods().names())
    for (const KeySpec& k : quantizer_methods().get(name).option_keys()) {
      auto o = std::find_if(options.begin(), options.end(), [&](const KeySpec& p) { return p.name == k.name; });
      if (o == options.end()) {
        options.push_back(k);
        owners.emplace_back();
        o = options.end() - 1;
      }
      auto& owner = owners[static_cast<size_t>(o - options.begin()) - common];
      owner.first.push_back(name);
      owner.second.push_back(k.default_text);
    }
  for (size_t i = common; i < options.size(); ++i) {
    const std::vector<std::string>& methods = owners[i - common].first;
    const std::vector<std::string>& defaults = owners[i - common].second;
    const bool same = std::all_of(defaults.begin(), defaults.end(), [&](const std::string& d) { return d == defaults[0]; });
    std::string who, dflt;
    for (size_t m = 0; m < methods.size(); ++m) {
      who += (m ? ", " : "") + methods[m];
      dflt += (m ? ", " : "") + defaults[m] + " (" + methods[m] + ")";
    }
    options[i].description = who + ": " + options[i].description;
    options[i].default_text = same ? defaults[0] : dflt;
    // The method checks the value (range, choices) when it is given one.
    options[i].choices.clear();
    options[i].range = Range::any();
  }
  PassInfo p{"quantize", "quantize",
             "quantization-aware training: quantizers on weights (transform stack) and activations (act_quant)", options, {}};
  p.run = [](Graph& g, const PassCall& call) {
    Settings own;
    Config c;
    for (const auto& [key, value] : call.settings.values())
      (pass_schema().has(key) ? own[key] : c.options[key]) = value;
    pass_schema().parse_into(c, own, call.source);
    return apply(g, c).summary();
  };
  register_pass(std::move(p));
}

void register_all() {
  // Pending registrations first (this one among them when called before any registry lookup):
  // register_passes() looks the methods up, which must not start them inside the once-block, or
  // it would re-enter this function.
  ensure_registered();
  static std::once_flag once;
  std::call_once(once, [] {
    register_ops();
    register_transforms();
    // The calibrators, one file each (before the methods that start from them).
    register_minmax_calibrator();
    register_percentile_calibrator();
    register_mse_calibrator();
    register_entropy_calibrator();
    register_moving_minmax_calibrator();
    // The methods, one file each: their weight and activation quantizers and the method entry.
    register_dorefa();
    register_twn();
    register_bnn();
    register_xnor();
    register_lsq();
    register_lsq_plus();
    register_pact();
    register_int8();
    register_passes();  // after the methods: the pass takes their options
    register_bireal_pass();
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

Config resolve(const Config& config) {
  register_all();
  const QuantizerMethod& method = quantizer_method(config.method);
  // A key of another method is named as such, with the methods that have it.
  const std::vector<KeySpec> own = method.option_keys();
  for (const auto& entry : config.options.values()) {
    const std::string& key = entry.first;
    if (std::any_of(own.begin(), own.end(), [&](const KeySpec& k) { return k.name == key; })) continue;
    std::string owners;
    for (const auto& name : quantizer_methods().names())
      for (const KeySpec& k : quantizer_methods().get(name).option_keys())
        if (k.name == key) owners += (owners.empty() ? "" : ", ") + name;
    std::string keys;
    for (const KeySpec& k : own) keys += (keys.empty() ? "" : ", ") + k.name;
    throw Error("quantize: " + key + (owners.empty() ? " is not an option of any method" : " applies to method " + owners) +
                    ", not " + config.method + " (whose options are: " + (keys.empty() ? "none" : keys) + ")",
                ErrorKind::kUsage);
  }
  return method.resolve(config);
}

namespace {
// The value a monotone quantizer (or a sign binarizer) of `v` may stand at instead: up through the
// single-use, single-input ops that commute with it exactly in eval form (OpTraits::
// commutes_with_sign: max pooling, flatten, dropout), to the first value whose producer does not.
// Each op passed is appended to `chain`, the one reading the returned value last. `all_uses_quantized`
// (optional) also lets the first value have several users when every use of it is quantized there
// (an ImageNet stem's max pooling read by a block's first convolution and its residual add).
std::string up_through_commuting_ops(const Graph& graph, std::string v, std::vector<std::string>* chain,
                                     const std::function<bool(const std::string&)>& all_uses_quantized = {}) {
  for (bool first = true;; first = false) {
    const ValueInfo& vi = graph.value(v);
    if (vi.producer.empty()) return v;
    const Node& p = graph.node(vi.producer);
    const bool single_use = graph.users(v).size() == 1 || (first && all_uses_quantized && all_uses_quantized(v));
    if (!op_traits(p.op).commutes_with_sign || p.inputs.size() != 1 || !single_use || graph.is_output(v)) return v;
    chain->push_back(p.name);
    v = p.inputs[0];
  }
}

// The nodes joining quantized layers whose inputs a whole-network int8 quantizer quantizes too
// (ActivationPlan::whole_network): nodes of an op the registry marks integer_inputs (residual
// adds, concatenations) each of whose inputs comes from one of `layers` (its output or, shared,
// its input) or from an existing quantizer, directly or through single-input nodes other than
// layers (a batch norm, a ReLU, pooling).
std::vector<std::string> integer_joins(const Graph& graph, const std::vector<std::string>& layers) {
  std::set<std::string> sources;
  for (const auto& name : layers) {
    const Node& n = graph.node(name);
    sources.insert(n.inputs.at(0));
    sources.insert(n.outputs.begin(), n.outputs.end());
  }
  for (const auto& n : graph.nodes())
    if (n.op == "act_quant") sources.insert(n.outputs.begin(), n.outputs.end());
  auto from_layers = [&](std::string v) {
    for (size_t steps = 0; steps < graph.nodes().size(); ++steps) {
      if (sources.count(v)) return true;
      const ValueInfo& vi = graph.value(v);
      if (vi.producer.empty()) return false;
      const Node& p = graph.node(vi.producer);
      if (p.inputs.size() != 1 || is_weighted_layer(p)) return false;  // a layer left in float (chosen ones are sources)
      v = p.inputs[0];
    }
    return false;
  };
  std::vector<std::string> joins;
  for (const auto& n : graph.nodes()) {
    if (!op_registry().contains(n.op) || !op_traits(n.op).integer_inputs || n.inputs.empty()) continue;
    if (std::all_of(n.inputs.begin(), n.inputs.end(), from_layers)) joins.push_back(n.name);
  }
  return joins;
}

// select_layers with `c` already resolved and its method looked up.
Report select_resolved(const Graph& graph, const Config& c, const QuantizerMethod& method) {
  const bool has_weight = !method.weight_quantizer(c).empty();
  Report report;
  std::vector<std::string> layers;
  for (const auto& n : graph.nodes())
    if (is_weighted_layer(n)) layers.push_back(n.name);  // the registry says which ops are layers
  if (layers.empty()) return report;
  const std::set<std::string> named(c.targets.begin(), c.targets.end());
  std::vector<std::string>& chosen = report.quantized;
  for (const auto& name : select_nodes(graph, c.targets, c.ignore)) {
    const Node& n = graph.node(name);
    if (!is_weighted_layer(n)) continue;
    if ((name == layers.front() || name == layers.back()) && !named.count(name) && !method.quantizes_first_and_last(c)) {
      report.skipped.push_back(name + ": first or last layer stays in full precision (name it in targets to quantize it)");
      continue;
    }
    if (std::string why = quantizer_stack_problem(n); !why.empty()) {
      report.skipped.push_back(name + ": " + why);
      continue;
    }
    // Per-channel scales index the weight's output-channel axis. A grouped transposed convolution's
    // weight [C_in, C_out/groups, kh, kw] holds C_out/groups there, so one scale would serve an
    // output channel of every group: not one scale per output channel.
    if (has_weight && channel_groups(n) > 1 && weight_output_axis(n).value_or(0) != 0) {
      Node probe = n;
      method.attach_weight(probe, c);
      if (probe.has_attr("granularity") && node_granularity(probe) == Granularity::kPerChannel) {
        report.skipped.push_back(name + ": a grouped transposed convolution (groups " + std::to_string(channel_groups(n)) +
                                 ") cannot have one scale per output channel; quantize it with granularity per_tensor");
        continue;
      }
    }
    chosen.push_back(name);
  }
  return report;
}
}  // namespace

Report select_layers(const Graph& graph, const Config& config) {
  register_all();
  const Config c = resolve(config);
  return select_resolved(graph, c, quantizer_method(c.method));
}

Report apply(Graph& graph, const Config& config_in) {
  register_all();
  const Config c = resolve(config_in);
  const QuantizerMethod& method = quantizer_method(c.method);
  // 1. The layers to quantize, in graph order.
  Report report = select_resolved(graph, c, method);
  const std::vector<std::string> chosen = std::move(report.quantized);
  report.quantized.clear();
  const std::string weight_quantizer = method.weight_quantizer(c);
  const std::optional<ActivationPlan> acts = method.activations(c);
  const bool quant_acts = acts.has_value();
  if (weight_quantizer.empty() && !quant_acts) return report;

  // 2. Weights: attributes (and learned parameters) only; the transform runs in GraphModule's forward.
  if (!weight_quantizer.empty()) {
    for (const auto& name : chosen) {
      Node& n = graph.node(name);
      push_weight_transform(n, weight_quantizer);
      method.attach_weight(n, c);
    }
  }

  // 3. Activations: one quantizer per distinct input value, shared by the layers reading it.
  const bool binary = quant_acts && activation_quantizers().get(acts->quantizer).placement == Placement::kBinarizeReluInput;
  // The attributes of the act_quant nodes (relu = 1 added where one stands for a ReLU too).
  std::map<std::string, Attr> act_attrs;
  if (quant_acts) {
    act_attrs = acts->attrs;
    act_attrs["method"] = acts->quantizer;
  }
  const std::set<std::string> chosen_set(chosen.begin(), chosen.end());
  std::map<std::string, std::string> quantized_value;  // original input value → quantized value
  std::map<std::string, std::string> real_source;      // layer → real-valued value its binary input comes from ("" unknown)
  if (quant_acts) {
    // The inputs to quantize: the first of each chosen layer and, when the plan asks, every input
    // of the nodes joining them (integer_joins), in graph order, so that the first use of a value
    // gets its quantizer in front of it and the later uses share it.
    std::vector<std::pair<std::string, size_t>> uses;
    for (const auto& name : chosen) uses.emplace_back(name, 0);
    if (!binary && acts->whole_network)
      for (const auto& name : integer_joins(graph, chosen))
        for (size_t i = 0; i < graph.node(name).inputs.size(); ++i) uses.emplace_back(name, i);
    std::stable_sort(uses.begin(), uses.end(), [&](const auto& a, const auto& b) {
      return graph.node_index(a.first) < graph.node_index(b.first);
    });
    const std::set<std::pair<std::string, size_t>> use_set(uses.begin(), uses.end());
    // What an earlier apply() quantized stays as it is (a join reading it is not quantized again).
    for (const auto& n : graph.nodes())
      if (n.op == "act_quant")
        for (const auto& o : n.outputs) quantized_value[o] = o;
    for (const auto& [name, slot] : uses) {
      const std::string v = graph.node(name).inputs.at(slot);
      auto done = quantized_value.find(v);
      if (done != quantized_value.end()) {
        graph.node(name).inputs[slot] = done->second;
        real_source[name] = real_source[done->first];
        continue;
      }
      if (!binary) {
        // Whole network: the quantizer moves up to the ReLU before max pooling, flatten or dropout
        // (single-use ops that commute with a monotone quantizer exactly in eval form,
        // OpTraits::commutes_with_sign; in training a dropout between them scales the kept codes by
        // 1/(1 − p)), where an integer runtime fuses it into the layer producing the ReLU's input.
        std::vector<std::string> chain;
        auto all_uses_quantized = [&](const std::string& value) {
          for (const auto& u : graph.users(value)) {
            const Node& un = graph.node(u);
            for (size_t j = 0; j < un.inputs.size(); ++j)
              if (un.inputs[j] == value && !use_set.count({u, j})) return false;
          }
          return true;
        };
        const std::string cur =
            acts->whole_network ? up_through_commuting_ops(graph, v, &chain, all_uses_quantized) : v;
        const std::string chain_head = chain.empty() ? "" : chain.back();  // the op of the chain reading `cur`
        // A ReLU whose every use is an input quantized here (or that chain) becomes the quantizer
        // itself (relu = 1): the same values and gradients as ReLU then quantizer, one pass fewer
        // each way.
        const ValueInfo& vi = graph.value(cur);
        if (!vi.producer.empty() && graph.node(vi.producer).op == "relu" && !graph.is_output(cur)) {
          bool only_quantized_uses = true;
          for (const auto& u : graph.users(cur)) {
            const Node& un = graph.node(u);
            for (size_t j = 0; j < un.inputs.size(); ++j)
              if (un.inputs[j] == cur && !use_set.count({u, j}) && u != chain_head) only_quantized_uses = false;
          }
          if (only_quantized_uses) {
            Node& r = graph.node(vi.producer);
            r.op = "act_quant";
            r.attrs = act_attrs;
            r.attrs["relu"] = int64_t{1};
            report.replaced.push_back(r.name);
            quantized_value[v] = v;
            quantized_value[cur] = cur;
            continue;
          }
        }
        Node q = make_node(graph.unique_name(name + ".act_quant"), "act_quant", {v}, act_attrs);
        const std::string out = graph.insert_node_before(name, q);
        report.inserted.push_back(q.name);
        quantized_value[v] = out;
        graph.node(name).inputs[slot] = out;
        continue;
      }
      // Binary: find the ReLU feeding the layer, possibly through sign-commuting single-use ops.
      std::vector<std::string> chain;
      const std::string cur = up_through_commuting_ops(graph, v, &chain);
      if (quantized_value.count(cur)) {
        // Binarized already, behind max pooling or flatten (an earlier entry's binarizer: the
        // activations stage before the weights one): the layer reads signs as it is.
        quantized_value[v] = v;
        real_source[name] = "";
        continue;
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
          r.attrs = act_attrs;
          report.replaced.push_back(r.name);
          quantized_value[v] = v;
          quantized_value[cur] = cur;
          real_source[name] = chain.empty() ? source : "";
          continue;
        }
        if (chain.empty()) {
          const std::string source = relu->inputs[0];
          Node q = make_node(graph.unique_name(name + ".act_quant"), "act_quant", {source}, act_attrs);
          const std::string out = graph.insert_node_before(name, q);
          report.inserted.push_back(q.name);
          quantized_value[v] = out;
          graph.node(name).inputs[0] = out;
          real_source[name] = source;
          continue;
        }
      }
      Node q = make_node(graph.unique_name(name + ".act_quant"), "act_quant", {v}, act_attrs);
      const std::string out = graph.insert_node_before(name, q);
      report.inserted.push_back(q.name);
      quantized_value[v] = out;
      graph.node(name).inputs[0] = out;
      real_source[name] = v;
    }
  }

  // The activation quantizer's learned parameters on the nodes made above.
  if (quant_acts) {
    const ActivationQuantizer& aq = activation_quantizers().get(acts->quantizer);
    if (aq.attach) {
      // On the device of the layers' weights, as the weight quantizers' parameters are.
      std::optional<at::Device> device;
      for (const auto& name : chosen)
        if (const at::Tensor* w = graph.node(name).params.find("weight"); w && w->defined()) device = w->device();
      // The act_quant nodes made above: all that the report lists so far (finish() adds its own later).
      std::vector<std::string> made = report.inserted;
      made.insert(made.end(), report.replaced.begin(), report.replaced.end());
      for (const auto& name : made) {
        Node& n = graph.node(name);
        aq.attach(n);
        if (!device) continue;
        for (const auto& p : aq.params)
          if (const at::Tensor* t = n.params.find(p); t && t->defined() && t->device() != *device)
            n.params.set(p, t->detach().to(*device).set_requires_grad(true));
        for (const auto& b : aq.buffers)
          if (const at::Tensor* t = n.buffers.find(b); t && t->defined() && t->device() != *device)
            n.buffers.set(b, t->to(*device));
      }
    }
  }

  // 4. What the method adds beyond its quantizers (XNOR-Net's K scale).
  method.finish(graph, c, chosen, real_source, report);

  for (const auto& name : chosen) report.quantized.push_back(name);
  graph.infer_shapes();
  graph.validate();
  return report;
}

Report apply(GraphModule& module, const Config& config) {
  return run_on_module(module, "quantize", ModuleMode::kAny, [&](Graph& g) { return apply(g, config); });
}

int64_t after_step(Graph& graph, const Config& resolved) {
  register_all();
  return quantizer_method(resolved.method).after_step(graph, resolved);
}

int64_t sync_replicas(Graph& graph, const std::function<void(at::Tensor&)>& replica_sum, int64_t ranks) {
  register_all();
  if (ranks < 1) throw Error("sync_replicas: " + std::to_string(ranks) + " ranks");
  std::vector<const Node*> nodes;
  std::vector<at::Tensor> buffers;
  for (const Node& n : graph.nodes()) {
    if (n.op != "act_quant") continue;
    const ActivationQuantizer& q = activation_quantizer_of(n);
    if (!q.replica_buffers) continue;
    std::vector<at::Tensor> own = q.replica_buffers(n);
    if (own.empty()) continue;
    nodes.push_back(&n);
    for (at::Tensor& b : own) buffers.push_back(std::move(b));
  }
  if (nodes.empty()) return 0;
  // One collective for all of them: their values in float64, summed, divided, written back.
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (const at::Tensor& b : buffers) flat.push_back(b.detach().reshape({-1}).to(at::kDouble));
  at::Tensor all = at::cat(flat);
  replica_sum(all);
  all.div_(static_cast<double>(ranks));
  int64_t offset = 0;
  for (at::Tensor& b : buffers) {
    const int64_t k = b.numel();
    b.copy_(all.slice(0, offset, offset + k).view(b.sizes()).to(b.device(), b.scalar_type()));
    offset += k;
  }
  for (const Node* n : nodes) activation_quantizer_of(*n).replicas_synced(*n);
  return static_cast<int64_t>(nodes.size());
}

int64_t at_epoch(Graph& graph, const Config& resolved, double epoch) {
  register_all();
  return quantizer_method(resolved.method).at_epoch(graph, resolved, epoch);
}

std::vector<std::string> selected_layers(const Graph& graph, const Config& c) {
  std::vector<std::string> all, layers;
  for (const auto& n : graph.nodes())
    if (is_weighted_layer(n)) all.push_back(n.name);
  if (all.empty()) return layers;
  const std::set<std::string> named(c.targets.begin(), c.targets.end());
  const bool edges = quantizer_method(c.method).quantizes_first_and_last(c);
  for (const auto& name : select_nodes(graph, c.targets, c.ignore)) {
    if (!is_weighted_layer(graph.node(name))) continue;
    if ((name == all.front() || name == all.back()) && !named.count(name) && !edges) continue;
    layers.push_back(name);
  }
  return layers;
}

std::vector<std::string> quantized_by(const Graph& graph, const Config& config) {
  register_all();
  const Config c = resolve(config);
  const std::string wq = quantizer_method(c.method).weight_quantizer(c);
  std::vector<std::string> layers;
  if (wq.empty()) return layers;
  for (const auto& name : selected_layers(graph, c)) {
    const Node& n = graph.node(name);
    if (!n.weight_transforms.empty() && n.weight_transforms.back() == wq) layers.push_back(name);
  }
  return layers;
}

Report change_bits(Graph& graph, const Config& config) {
  register_all();
  const Config c = resolve(config);
  const QuantizerMethod& method = quantizer_method(c.method);
  if (!method.changes_bits()) method.change_bits(graph, {}, c);  // throws its message
  Report report = select_resolved(graph, c, method);  // the selected layers not quantized yet
  const std::vector<std::string> layers = quantized_by(graph, c);
  if (!report.quantized.empty() && !layers.empty())
    throw Error("quantize: " + c.method + " W" + std::to_string(c.weight_bits) + "A" + std::to_string(c.activation_bits) +
                    " selects " + layers.front() + ", which the method quantized already, and " +
                    report.quantized.front() + ", which it did not: a later entry changes the bits of the earlier "
                    "entry's layers only (give it the same targets)",
                ErrorKind::kUsage);
  report = Report();
  if (layers.empty()) return report;
  method.change_bits(graph, layers, c);
  report.quantized = layers;
  graph.infer_shapes();
  graph.validate();
  return report;
}

Report change_bits(GraphModule& module, const Config& config) {
  return run_on_module(module, "quantize", ModuleMode::kAny, [&](Graph& g) { return change_bits(g, config); });
}

at::Tensor penalty(const Graph& graph, const Config& resolved) {
  register_all();
  return quantizer_method(resolved.method).penalty(graph, resolved);
}

namespace {
// An act_quant node whose quantizer sets learned parameters from data (its own rule or a calibrator).
bool learns_from_data(const Node& n) {
  if (n.op != "act_quant") return false;
  const auto& q = activation_quantizer_of(n);
  return q.initialize || q.calibrate;
}
}  // namespace

std::vector<std::string> nodes_to_initialize(const Graph& graph, const Report& report) {
  register_all();
  std::vector<std::string> out;
  for (const auto* list : {&report.inserted, &report.replaced})
    for (const auto& name : *list) {
      const Node* n = graph.find_node(name);
      if (n && learns_from_data(*n)) out.push_back(name);
    }
  return out;
}

std::vector<std::string> input_quantizers(const Graph& graph, const std::vector<std::string>& layers) {
  register_all();
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& name : layers) {
    const Node* n = graph.find_node(name);
    if (!n || n->inputs.empty()) continue;
    const std::string& producer = graph.value(n->inputs.at(0)).producer;
    const Node* a = producer.empty() ? nullptr : graph.find_node(producer);
    if (a && learns_from_data(*a) && seen.insert(producer).second) out.push_back(producer);
  }
  return out;
}

int64_t initialize_learned(GraphModule& module, const at::Tensor& batch, const std::vector<std::string>& nodes) {
  register_all();
  at::NoGradGuard no_grad;
  const std::set<std::string> only(nodes.begin(), nodes.end());
  std::vector<std::pair<at::Tensor, at::Tensor>> buffers;  // (buffer, its value before)
  for (const auto& b : module->named_buffers())
    if (b.value().defined()) buffers.emplace_back(b.value(), b.value().clone());
  int64_t count = 0;
  struct Scope {
    Scope(int64_t* c, const std::set<std::string>* only) {
      t_initialized = c;
      t_initialize_only = only;
    }
    ~Scope() {
      t_initialized = nullptr;
      t_initialize_only = nullptr;
    }
  } scope(&count, &only);
  module->forward(batch);
  for (auto& [buffer, before] : buffers) buffer.copy_(before);
  return count;
}

int64_t calibrate_learned(GraphModule& module, const std::function<at::Tensor(int64_t)>& batch,
                          const Calibration& calibration, const std::vector<std::string>& nodes,
                          const std::function<void(Histogram&)>& merge_ranks) {
  register_all();
  const Calibrator& calibrator = quantize::calibrator(calibration.calibrator);
  if (calibration.batches < 1)
    throw Error("calibrate: " + std::to_string(calibration.batches) + " batches (at least 1)", ErrorKind::kUsage);
  // The nodes to calibrate: act_quant nodes whose quantizer can be (among `nodes`, when given).
  const std::set<std::string> only(nodes.begin(), nodes.end());
  std::map<std::string, Histogram> observed;
  for (const auto& n : module->graph().nodes())
    if (n.op == "act_quant" && activation_quantizer_of(n).calibrate && (only.empty() || only.count(n.name)))
      observed[n.name];
  if (observed.empty()) return 0;
  {
    at::NoGradGuard no_grad;
    std::vector<std::pair<at::Tensor, at::Tensor>> buffers;  // (buffer, its value before)
    for (const auto& b : module->named_buffers())
      if (b.value().defined()) buffers.emplace_back(b.value(), b.value().clone());
    struct Scope {
      std::map<std::string, Histogram>* before = t_observed;
      explicit Scope(std::map<std::string, Histogram>* o) { t_observed = o; }
      ~Scope() { t_observed = before; }
    } scope(&observed);
    try {
      for (int64_t i = 0; i < calibration.batches; ++i) module->forward(batch(i));
    } catch (...) {
      for (auto& [buffer, before] : buffers) buffer.copy_(before);
      throw;
    }
    for (auto& [buffer, before] : buffers) buffer.copy_(before);
  }
  if (merge_ranks)
    for (auto& [name, h] : observed) merge_ranks(h);  // every rank in the same (name) order
  // Then each node's parameters from its histogram.
  int64_t count = 0;
  for (const auto& [name, h] : observed) {
    if (h.count == 0) continue;  // a node the forward did not reach keeps what it has
    const Node& n = module->graph().node(name);
    activation_quantizer_of(n).calibrate(n, h, calibrator, calibration.options);
    ++count;
  }
  return count;
}

int64_t storage_bits(int64_t bits) { return std::clamp<int64_t>(bits, 1, 8); }

bool has_quantized_weight(const Node& n) {
  // The stack must end in a quantizer with only masks before it (they are baked into the codes);
  // a fold (QAT BN) changes the weight with training-time statistics and is never packed.
  const auto& s = n.weight_transforms;
  if (s.empty() || weight_transform(s.back()).kind != TransformKind::kQuantizer) return false;
  if (!weight_quantizers().contains(s.back())) return false;
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
  return weight_quantizers().get(t).encode(n, w);
}

std::optional<WeightQuantization> weight_quantization(const Node& n) {
  WeightQuantization q;
  if (n.weight_transforms.size() == 1 && n.weight_transforms[0] == "packed") {
    const at::Tensor* scale = n.buffers.find("weight_scale");
    if (!scale || !scale->defined() || !n.has_attr("weight_bits") || !n.has_attr("weight_encoding"))
      node_fail(n, "packed weight needs buffer 'weight_scale' and attributes weight_bits and weight_encoding");
    q.method = n.attr_str("quant_method");
    q.encoding = encoding_from_name(n.attr_str("weight_encoding"));
    q.bits = n.attr_int("weight_bits");
    q.axis = n.attr_int("weight_axis");
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

std::optional<IntegerGrid> integer_grid(const Node& n) {
  const std::optional<WeightQuantization> q = weight_quantization(n);
  if (!q) return std::nullopt;
  EncodedWeight e;
  e.scale = q->scale;
  e.encoding = q->encoding;
  e.bits = q->bits;
  e.axis = q->axis;
  const Shape shape = n.params.contains("weight") ? n.params.at("weight").sizes().vec() : n.attr_ints("weight_shape");
  if (const WeightQuantizer* entry = weight_quantizers().find(q->method))
    return entry->integer_grid ? entry->integer_grid(e, shape) : std::nullopt;
  // Packed codes that do not name their quantizer: the first whose grid their encoding is.
  for (const auto& name : weight_quantizers().names()) {
    const WeightQuantizer& w = weight_quantizers().get(name);
    if (!w.integer_grid) continue;
    if (std::optional<IntegerGrid> g = w.integer_grid(e, shape)) return g;
  }
  return std::nullopt;
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
    // The masks are in the codes, the quantizer's learned parameters in the scales: the decoder
    // replaces the whole stack.
    for (const auto& name : n.weight_transforms) {
      const WeightTransform& t = weight_transform(name);
      for (const auto& b : t.buffers) n.buffers.erase(b);
      for (const auto& p : t.params) n.params.erase(p);
    }
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
  const int64_t axis = n.attr_int("weight_axis");
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  // The quantizer that wrote the codes decodes them when it has its own decoding.
  const WeightQuantizer* q = n.has_attr("quant_method") ? weight_quantizers().find(n.attr_str("quant_method")) : nullptr;
  try {
    at::Tensor c = unpack_codes(*codes, storage_bits(bits), count).reshape(shape);
    const at::ScalarType dtype = at::isFloatingType(scale->scalar_type()) ? scale->scalar_type() : at::kFloat;
    if (q && q->decode) return q->decode(n, c, *scale, dtype);
    return decode_weight(c, *scale, enc, bits, axis, dtype);
  } catch (const Error& e) {
    node_fail(n, std::string("packed weight: ") + e.what());
  }
}

}  // namespace whittle::quantize
