// Physical channel removal and the folding of removed channels' constant outputs.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/registration.h"
#include "graph/pass_registry.h"
#include "graph/select.h"
#include "prune/prune.h"

namespace whittle::prune {

namespace {

Shape batch_one(Shape s) {
  if (!s.empty()) s[0] = 1;
  return s;
}

// The model's values when every producer outputs zeros (the masked model's view of removed
// channels: a removed filter and its bias are zero), in eval form, batch 1. Keyed by value name.
std::map<std::string, at::Tensor> zero_producer_values(const Graph& graph) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> env;
  for (const auto& in : graph.inputs()) env[in] = at::zeros(batch_one(graph.value(in).shape));
  for (const Node& n : graph.nodes()) {
    if (is_weighted_layer(n)) {
      for (const auto& o : n.outputs) env[o] = at::zeros(batch_one(graph.value(o).shape));
      continue;
    }
    std::vector<at::Tensor> args;
    for (const auto& v : n.inputs) args.push_back(env.at(v));
    std::vector<at::Tensor> outs = op_traits(n.op).forward(n, args, /*training=*/false);
    for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i) env[n.outputs[i]] = outs[i];
  }
  return env;
}

// The node's output for input `x`, with the weight its transform stack gives.
at::Tensor run_node(const Node& n, const at::Tensor& x) {
  Node shadow = n;
  if (!n.weight_transforms.empty()) {
    shadow.params.set("weight", transformed_weight(n, false));
    shadow.weight_transforms.clear();
  }
  return op_traits(n.op).forward(shadow, {x}, false).at(0);
}

bool has_bias_slot(const Node& n) {
  const OpTraits& t = op_traits(n.op);
  auto in = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), "bias") != v.end(); };
  return t.folds_batchnorm && (in(t.optional_params) || in(t.required_params));
}

// Folds the removed channels' constant values at each consumer into its bias (see
// remove_channels). `removed_inputs` holds, per consumer node, its removed input positions.
void fold_constants(Graph& graph, const std::map<std::string, std::set<int64_t>>& removed_inputs, Report& report) {
  if (removed_inputs.empty()) return;
  std::map<std::string, at::Tensor> env;
  try {
    env = zero_producer_values(graph);
  } catch (const std::exception& e) {
    report.not_folded.push_back(std::string("constant outputs not folded: ") + e.what());
    return;
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, positions] : removed_inputs) {
    Node& n = graph.node(name);
    const at::Tensor x = env.at(n.inputs.at(0));
    if (x.dim() < 2) continue;
    const int64_t in_axis = channel_axis(n, x.sizes().vec());  // the channels the consumer reads
    at::Tensor xc = at::zeros_like(x);
    bool varies = false;
    for (int64_t p : positions) {
      at::Tensor ch = x.select(in_axis, p);
      const double lo = ch.min().item<double>(), hi = ch.max().item<double>();
      if (hi - lo > 1e-6 * (1 + std::max(std::abs(lo), std::abs(hi)))) varies = true;
      xc.select(in_axis, p).copy_(ch);
    }
    if (xc.abs().max().item<double>() == 0) continue;  // the removed channels carry zeros: nothing to fold
    if (varies) {
      report.not_folded.push_back(name + ": a removed input channel's value varies over positions (zero padding before it)");
      continue;
    }
    if (!has_bias_slot(n)) {
      report.not_folded.push_back(name + " (" + n.op + "): no bias to fold the removed channels' constant into");
      continue;
    }
    at::Tensor delta = run_node(n, xc) - run_node(n, at::zeros_like(x));
    delta = delta.movedim(channel_axis(n, delta.sizes().vec()), 1);  // output channels on dim 1
    at::Tensor per = delta.dim() > 2 ? delta.flatten(2) : delta.unsqueeze(2);  // [1, Cout, positions]
    const at::Tensor first = per.select(2, 0).squeeze(0);
    const double spread = (per - per.select(2, 0).unsqueeze(2)).abs().max().item<double>();
    if (spread > 1e-5 * (1 + first.abs().max().item<double>())) {
      report.not_folded.push_back(name + ": the removed channels' constant gives a position-dependent output (zero padding)");
      continue;
    }
    at::Tensor* bias = n.params.find("bias");
    if (!bias || !bias->defined()) {
      const at::Tensor& w = n.params.at("weight");
      n.params.set("bias", at::zeros({first.size(0)}, w.options()).set_requires_grad(w.requires_grad()));
      bias = n.params.find("bias");
    }
    bias->detach().add_(first.to(bias->dtype()).to(bias->device()));
    std::ostringstream os;
    os << name << ".bias += the constant of " << positions.size() << " removed input position(s)";
    report.folded.push_back(os.str());
  }
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

Report remove_channels(Graph& graph, const Plan& plan, bool fold_constant_outputs) {
  Report report;
  report.before = graph_cost(graph);
  report.skipped = plan.skipped;
  // Removed positions per (node, side), gathered over all groups first: a consumer of a concat
  // may lose input channels of several groups, sliced at once.
  std::map<std::pair<std::string, int>, std::set<int64_t>> removed;
  std::map<std::pair<std::string, int>, int64_t> sizes;
  std::map<std::string, std::set<int64_t>> removed_inputs;  // consumers, for constant folding
  for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
    const DependencyGroup& g = plan.groups[gi];
    const std::vector<int64_t>& rm = gi < plan.remove.size() ? plan.remove[gi] : std::vector<int64_t>{};
    if (rm.empty()) continue;
    for (const Member& m : g.members) {
      if (m.tied && m.role == ChannelRole::kInput) continue;  // its output slice removes these too
      // A layer remembers its width before any pruning, for `whittle inspect`.
      if (m.role == ChannelRole::kOutput) {
        Node& n = graph.node(m.node);
        if (!n.has_attr("unpruned_channels")) n.attrs["unpruned_channels"] = m.size;
      }
      const auto key = std::make_pair(m.node, static_cast<int>(m.role));
      sizes[key] = m.size;
      for (int64_t k : rm)
        for (int64_t p : m.positions.at(static_cast<size_t>(k))) removed[key].insert(p);
      if (m.role == ChannelRole::kInput && is_weighted_layer(graph.node(m.node)))
        for (int64_t k : rm)
          for (int64_t p : m.positions.at(static_cast<size_t>(k))) removed_inputs[m.node].insert(p);
    }
    std::ostringstream os;
    os << "group " << g.id << " (" << join(g.producers()) << "): " << g.channels << " → " << g.channels - static_cast<int64_t>(rm.size())
       << " channels";
    report.pruned.push_back(os.str());
    report.channels_removed += static_cast<int64_t>(rm.size());
  }
  // Every layer remembers its parameters and MACs before any pruning, for `whittle inspect`.
  if (!removed.empty())
    for (Node& n : graph.nodes()) {
      if (n.has_attr("unpruned_params")) continue;
      const NodeCost c = node_cost(graph, n);
      if (c.params == 0 && c.macs == 0) continue;
      n.attrs["unpruned_params"] = c.params;
      n.attrs["unpruned_macs"] = c.macs;
    }
  if (fold_constant_outputs) fold_constants(graph, removed_inputs, report);
  for (const auto& [key, positions] : removed) {
    std::vector<int64_t> keep;
    for (int64_t p = 0; p < sizes.at(key); ++p)
      if (!positions.count(p)) keep.push_back(p);
    slice_channels(graph.node(key.first), static_cast<ChannelRole>(key.second), keep);
  }
  graph.infer_shapes();
  graph.validate();
  report.after = graph_cost(graph);
  return report;
}

Report remove_channels(GraphModule& module, const Plan& plan, bool fold_constant_outputs) {
  Report r = remove_channels(module->graph(), plan, fold_constant_outputs);
  module->sync();
  return r;
}

const OptionsSchema<PruneOptions>& options_schema() {
  using O = PruneOptions;
  static const auto schema =
      OptionsSchema<O>()
          .add("criterion", &O::criterion, "channel importance (docs/pruning.md; taylor: from training gradients, recipes only)",
               {"l1", "l2", "bn_scale", "fpgm", "taylor", "random"})
          .add("group_reduction", &O::group_reduction, "combine the members' scores of a group by their sum or mean",
               {"sum", "mean"})
          .add("sparsity", &O::sparsity, "fraction of each group's channels removed (without a target)")
          .in_range(Range::half_open(0, 1))
          .add("target_macs", &O::target_macs, "MACs kept, a fraction of the unpruned model's", {}, "none")
          .in_range(Range{0, 1, true, false})
          .add("target_params", &O::target_params, "parameters kept, a fraction", {}, "none")
          .in_range(Range{0, 1, true, false})
          .add("global", &O::global, "rank all groups' channels together (scores over their group's mean)")
          .add("round_to", &O::round_to, "kept channels a multiple of this")
          .in_range(Range::at_least(1))
          .add("min_channels", &O::min_channels, "no group keeps fewer channels")
          .in_range(Range::at_least(1))
          .add("fold_constant_outputs", &O::fold_constant_outputs,
               "fold removed channels' constant outputs (BN β through ReLU) into the next layer's bias")
          .add("concat_ranking", &O::concat_ranking,
               "a concatenation's group: each layer loses its share, ranked within it (per_layer), or one ranking "
               "over the group (whole_group)",
               {"per_layer", "whole_group"})
          .add("targets", &O::targets, "layers whose output channels may go: names, op kinds or re:<regex> (default: all)")
          .add("ignore", &O::ignore, "layers to leave alone");
  return schema;
}

PruneOptions pass_options(const Settings& settings, const OptionSource& source) {
  const PruneOptions o = options_schema().parse(settings, source);
  const int amounts = static_cast<int>(settings.contains("sparsity") + settings.contains("target_macs") +
                                       settings.contains("target_params"));
  if (amounts > 1)
    throw Error(source.where + ": give one of " + source.key("sparsity") + ", " + source.key("target_macs") + " and " +
                    source.key("target_params"),
                ErrorKind::kUsage);
  if (o.criterion == "taylor")
    throw Error(source.about("criterion") + ": 'taylor' needs gradients from training; use the recipe modifier 'prune'",
                ErrorKind::kUsage);
  return o;
}

Config make_config(const PruneOptions& o) {
  if (o.target_macs && o.target_params)
    throw Error("give target_macs or target_params, not both", ErrorKind::kUsage);
  Config c;
  c.scoring.criterion = criterion_from_name(o.criterion);
  c.scoring.mean_over_members = o.group_reduction == "mean";
  c.sparsity = o.sparsity;
  c.target_macs = o.target_macs.value_or(0);
  c.target_params = o.target_params.value_or(0);
  c.global = o.global;
  c.round_to = o.round_to;
  c.min_channels = o.min_channels;
  c.fold_constant_outputs = o.fold_constant_outputs;
  c.rank_per_layer = o.concat_ranking == "per_layer";
  c.targets = o.targets;
  c.ignore = o.ignore;
  return c;
}

Report prune(GraphModule& module, const Config& config) {
  register_all();
  return remove_channels(module, make_plan(module->graph(), config), config.fold_constant_outputs);
}

std::string Report::summary() const {
  std::ostringstream os;
  auto pct = [](int64_t a, int64_t b) {
    std::ostringstream s;
    s.precision(1);
    s << std::fixed << (b > 0 ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0) << " %";
    return s.str();
  };
  os << "prune: removed " << channels_removed << " channels in " << pruned.size() << " groups; MACs " << before.macs << " → "
     << after.macs << " (" << pct(after.macs, before.macs) << "), parameters " << before.params << " → " << after.params
     << " (" << pct(after.params, before.params) << ")\n";
  for (const auto& l : pruned) os << "  " << l << "\n";
  for (const auto& l : folded) os << "  folded " << l << "\n";
  for (const auto& l : not_folded) os << "  not folded: " << l << "\n";
  for (const auto& l : skipped) os << "  skipped " << l << "\n";
  return os.str();
}

namespace {

void register_passes() {
  register_pass(make_pass(
      "prune", "prune", "channel pruning: dependency groups, importance criteria, physical removal (docs/pruning.md)",
      options_schema(), [](Graph& g, const PruneOptions&, const PassCall& call) {
        const OptionSource& src = call.source;
        const Config c = make_config(pass_options(call.settings, src));
        try {
          require_matches(g, c.targets, src.key("targets"));
          require_matches(g, c.ignore, src.key("ignore"));
        } catch (const Error& e) {
          throw Error(src.where + ": " + e.what(), ErrorKind::kUsage);
        }
        const Plan plan = make_plan(g, c);
        // A prune that removes nothing is refused, as a quantize that quantizes nothing is.
        if (plan.removed() == 0)
          throw Error(src.where + ": nothing would be removed: " + why_nothing_removed(plan, c, src), ErrorKind::kUsage);
        return remove_channels(g, plan, c.fold_constant_outputs).summary();
      }));
}

}  // namespace

void register_all() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_passes();
    // What a layer was before any pruning, recorded when its channels are first removed.
    register_node_annotation(AttrSpec::optional("unpruned_channels", AttrType::kInt, "output channels before pruning")
                                 .range(1, std::nullopt));
    register_node_annotation(AttrSpec::optional("unpruned_params", AttrType::kInt, "parameters before pruning")
                                 .range(0, std::nullopt));
    register_node_annotation(AttrSpec::optional("unpruned_macs", AttrType::kInt, "MACs of one run before pruning")
                                 .range(0, std::nullopt));
  });
}

WHITTLE_REGISTER_MODULE("prune", &register_all)

}  // namespace whittle::prune
