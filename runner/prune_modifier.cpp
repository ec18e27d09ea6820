#include "runner/prune_modifier.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/json_number.h"
#include "graph/select.h"
#include "runner/modifier.h"
#include "runner/optimizer.h"

namespace whittle::runner {

double scheduled_fraction(const std::string& schedule, int64_t step, int64_t steps, double initial, double final) {
  if (steps <= 1 || step >= steps || schedule == "one_shot") return final;
  const double t = static_cast<double>(step) / static_cast<double>(steps);
  if (schedule == "iterative") return final * t;
  return final + (initial - final) * std::pow(1.0 - t, 3.0);  // agp
}

namespace {

// Prunes at steps t_k = start_epoch + (k − 1)·update_frequency, k = 1..n (n = 1 for one_shot;
// otherwise the steps that fit before end_epoch), each step removing channels until the
// scheduled fraction of the final target is reached, measured against the unpruned model.
class PruneModifier : public Modifier {
 public:
  PruneModifier(const ModifierSpec& spec, const PruneModifierOptions& o) : Modifier(spec), o_(o) {
    try {
      config_ = prune::make_config(o);
    } catch (const Error& e) {
      fail(e.what());
    }
    config_.targets = spec.targets;
    config_.ignore = spec.ignore;
    if (o.schedule == "one_shot") {
      steps_ = 1;
    } else {
      if (spec.end_epoch < 0)
        fail("schedule '" + o.schedule + "' prunes in steps between start_epoch and end_epoch: give end_epoch "
             "(or schedule one_shot, the one schedule that also runs without training, training.epochs 0)");
      steps_ = static_cast<int64_t>(std::floor((spec.end_epoch - spec.start_epoch) / o.update_frequency + 1e-9));
      if (steps_ < 1)
        fail("update_frequency " + SettingValue(o.update_frequency).text() + " leaves no pruning step in [" +
             SettingValue(spec.start_epoch).text() + ", " + SettingValue(spec.end_epoch).text() + ")");
    }
    if (o.schedule == "agp" && o.initial_sparsity > (o.target_macs || o.target_params ? 1.0 : o.sparsity))
      fail("initial_sparsity is above the final sparsity");
  }

  void on_start(TrainContext& tc) override {
    if (base_macs_ == 0) {
      const NodeCost c = graph_cost(tc.model->graph());
      base_macs_ = c.macs;
      base_params_ = c.params;
      for (const Node& n : tc.model->graph().nodes())
        if (is_weighted_layer(n) && !n.outputs.empty()) {
          const Shape& s = tc.model->graph().value(n.outputs[0]).shape;
          if (s.size() >= 2) original_[n.name] = s[static_cast<size_t>(channel_axis(n, s))];
        }
    }
    if (config_.scoring.criterion == prune::Criterion::kTaylor) taylor_.attach(tc.model);
    // A run of 0 epochs (calibration only): the one step now, in list order, so that the entries
    // after it (BN folding, quantizers) see the pruned model.
    if (tc.recipe && tc.recipe->training.epochs == 0 && done_ < steps_) step(tc);
  }

  // Not a claim (a prune and a quantize entry may share layers): the check, before training, that the
  // entry's last step would remove something from the model as loaded, with each group's reason
  // when not (a run whose prune removed nothing was labelled "pruned L1 (sparsity 0.5)").
  std::vector<std::string> claimed_layers(const Graph& graph) const override {
    prune::Config c = config_;
    // Which groups can shrink does not depend on the scores; taylor's need training.
    if (c.scoring.criterion == prune::Criterion::kTaylor) c.scoring.criterion = prune::Criterion::kL1;
    if (!o_.target_macs && !o_.target_params) c.sparsity = o_.sparsity;
    prune::Plan plan;
    try {
      plan = prune::make_plan(graph, c);
    } catch (const Error& e) {
      fail(e.what());
    }
    if (plan.removed() == 0)
      fail("would remove nothing: " + prune::why_nothing_removed(plan, c, OptionSource{spec().location, KeyStyle::kRecipe}));
    return {};
  }

  // One step by a weight criterion prunes without training (training.epochs 0); the others prune
  // between training steps, or score by gradients.
  std::string needs_training() const override {
    if (o_.schedule != "one_shot") return "schedule '" + o_.schedule + "' prunes in steps over the training";
    if (config_.scoring.criterion == prune::Criterion::kTaylor) return "criterion taylor scores channels by their gradients";
    return "";
  }

  void on_step_begin(TrainContext& tc) override {
    if (done_ >= steps_) return;
    const double due = spec().start_epoch + static_cast<double>(done_) * o_.update_frequency;
    if (tc.epoch + 1e-12 < due) return;
    step(tc);
  }

  std::string state() const override {
    return nlohmann::json{{"steps_done", done_}, {"base_macs", base_macs_}, {"base_params", base_params_},
                          {"original_channels", original_}}
        .dump();
  }
  void load_state(const std::string& text) override {
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      done_ = json_int64(j.at("steps_done"), "steps_done");
      base_macs_ = json_int64(j.at("base_macs"), "base_macs");
      base_params_ = json_int64(j.at("base_params"), "base_params");
      original_.clear();
      for (const auto& [layer, channels] : j.at("original_channels").items())
        original_[layer] = json_int64(channels, "original_channels." + layer);
    } catch (const std::exception& e) {
      throw Error(spec().location + ": modifier 'prune': unreadable saved state '" + text + "': " + e.what());
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(spec().location + ": modifier 'prune': " + what, ErrorKind::kUsage);
  }

  void step(TrainContext& tc) {
    const int64_t k = done_ + 1;
    prune::Config c = config_;
    c.scoring.seed = tc.recipe ? static_cast<uint64_t>(tc.recipe->training.seed) + static_cast<uint64_t>(k) : 0;
    c.scoring.taylor = &taylor_;
    if (c.scoring.criterion == prune::Criterion::kTaylor && taylor_.sums().empty())
      fail("criterion 'taylor' needs gradients from training before its first step: start_epoch must be after the "
           "first batch");
    // Data parallel: each rank summed |w·g| over its own batches (the gradients before averaging);
    // the sums over all ranks make every rank remove the same channels.
    if (tc.replica_sum && c.scoring.criterion == prune::Criterion::kTaylor)
      for (const auto& [node, sum] : taylor_.sums()) {
        at::Tensor shared = sum;  // the same storage: summed in place
        tc.replica_sum(shared);
      }
    const NodeCost now = graph_cost(tc.model->graph());
    std::string goal;
    if (o_.target_macs || o_.target_params) {
      const bool macs = o_.target_macs.has_value();
      const double final_removed = 1.0 - (macs ? *o_.target_macs : *o_.target_params);
      const double keep = 1.0 - scheduled_fraction(o_.schedule, k, steps_, o_.initial_sparsity, final_removed);
      const double base = static_cast<double>(macs ? base_macs_ : base_params_);
      const double current = static_cast<double>(macs ? now.macs : now.params);
      const double relative = keep * base / current;
      goal = std::string(macs ? "MACs " : "parameters ") + SettingValue(keep).text() + " of the unpruned model";
      if (relative >= 1.0) return finish_step(tc, goal + ": already reached");
      (macs ? c.target_macs : c.target_params) = relative;
    } else {
      // Against each layer's original width: step k keeps C₀ − ⌊s_k·C₀⌋ channels.
      c.sparsity = scheduled_fraction(o_.schedule, k, steps_, o_.initial_sparsity, o_.sparsity);
      c.original_channels = original_;
      goal = "sparsity " + SettingValue(c.sparsity).text();
    }
    prune::Report r;
    try {
      const prune::Plan plan = prune::make_plan(tc.model->graph(), c);
      const SlicedState sliced = slice_optimizer_state(tc, plan);
      r = prune::remove_channels(tc.model, plan, c.fold_constant_outputs);
      // The sliced parameters are new tensors: their sliced state goes into the optimizer under
      // them, and the trainer's rebuild (rebuild_optimizer) carries it over like any other.
      if (tc.optimizer)
        for (const auto& [key, state] : sliced) {
          const auto dot = key.rfind('.');
          const at::Tensor* p = tc.model->graph().node(key.substr(0, dot)).params.find(key.substr(dot + 1));
          if (p && p->defined()) tc.optimizer->state()[p->unsafeGetTensorImpl()] = state->clone();
        }
    } catch (const Error& e) {
      throw Error(spec().location + ": modifier 'prune' (step " + std::to_string(k) + "): " + e.what(), e.kind());
    }
    tc.parameters_changed = true;
    if (c.scoring.criterion == prune::Criterion::kTaylor) {
      taylor_.reset();
      taylor_.attach(tc.model);
    }
    *tc.log << "prune step " << k << "/" << steps_ << " at epoch " << tc.epoch << " (" << goal << "): " << r.summary()
              << std::flush;
    finish_step(tc, "");
  }

  using SlicedState = std::map<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>;

  // Each parameter's optimizer state (momentum, Adam moments), sliced as `plan` slices the
  // parameter: the plan is replayed on shallow copies of the graph whose parameters are the state
  // tensors, one copy per state tensor. Keyed "node.param"; only parameters that have state.
  static SlicedState slice_optimizer_state(TrainContext& tc, const prune::Plan& plan) {
    SlicedState out;
    if (!tc.optimizer) return out;
    const Graph& g = tc.model->graph();
    struct Entry {
      std::string node, param;
      const torch::optim::OptimizerParamState* state;
      std::vector<at::Tensor> tensors;
    };
    std::vector<Entry> entries;
    size_t kinds = 0;
    for (const Node& n : g.nodes())
      for (const auto& [name, t] : n.params) {
        if (!t.defined()) continue;
        auto it = tc.optimizer->state().find(t.unsafeGetTensorImpl());
        if (it == tc.optimizer->state().end()) continue;
        std::vector<at::Tensor> st = shaped_state_tensors(*it->second);
        if (st.empty()) continue;
        kinds = std::max(kinds, st.size());
        entries.push_back({n.name, name, it->second.get(), std::move(st)});
      }
    if (entries.empty()) return out;
    std::vector<std::vector<at::Tensor>> sliced(entries.size());
    for (size_t kind = 0; kind < kinds; ++kind) {
      Graph shadow = g.clone(/*clone_tensors=*/false);
      for (const Entry& e : entries) {
        const at::Tensor& s = kind < e.tensors.size() ? e.tensors[kind] : at::Tensor();
        if (s.defined() && s.sizes().equals(g.node(e.node).params.at(e.param).sizes()))
          shadow.node(e.node).params.set(e.param, s.detach());
      }
      prune::remove_channels(shadow, plan, /*fold_constant_outputs=*/false);
      for (size_t i = 0; i < entries.size(); ++i) {
        const at::Tensor& s = kind < entries[i].tensors.size() ? entries[i].tensors[kind] : at::Tensor();
        sliced[i].push_back(s.defined() ? shadow.node(entries[i].node).params.at(entries[i].param) : at::Tensor());
      }
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      sliced[i].resize(entries[i].tensors.size());
      out[entries[i].node + "." + entries[i].param] = with_shaped_state_tensors(*entries[i].state, sliced[i]);
    }
    return out;
  }

  void finish_step(TrainContext& tc, const std::string& note) {
    if (!note.empty()) *tc.log << "prune step " << done_ + 1 << "/" << steps_ << ": " << note << "\n" << std::flush;
    ++done_;
  }

  PruneModifierOptions o_;
  prune::Config config_;
  prune::TaylorScores taylor_;
  int64_t steps_ = 1;
  int64_t done_ = 0;
  int64_t base_macs_ = 0;
  int64_t base_params_ = 0;
  std::map<std::string, int64_t> original_;  // producer → output channels before pruning
};

// Network slimming's sparsity regularizer (Liu et al. 2017): the loss gains s·Σ|γ| over the
// targeted nodes that have a normalization scale γ (the registry's norm_scale: batch_norm's
// weight, and conv_bn_qat's bn_weight once QAT has folded a BN into its layer), so their γ
// gradients gain s·sign(γ). No targets: every such node.
class BnSparsityModifier : public Modifier {
 public:
  BnSparsityModifier(const ModifierSpec& spec, const BnSparsityOptions& o) : Modifier(spec), o_(o) {}

  at::Tensor on_loss(TrainContext& tc, const at::Tensor& loss, const at::Tensor&, const at::Tensor&,
                     const at::Tensor&) override {
    const Graph& g = tc.model->graph();
    at::Tensor penalty = at::zeros({}, loss.options());
    for (const std::string& name : select_nodes(g, spec().targets, spec().ignore)) {
      const Node& n = g.node(name);
      const std::string& scale = norm_scale_param(n);
      if (scale.empty()) continue;
      if (const at::Tensor* gamma = n.params.find(scale); gamma && gamma->defined())
        penalty = penalty + gamma->abs().sum();
    }
    return loss + o_.penalty * penalty;
  }

 private:
  BnSparsityOptions o_;
};

}  // namespace

const OptionsSchema<PruneModifierOptions>& prune_modifier_schema() {
  using O = PruneModifierOptions;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .include(prune::options_schema(), {"targets", "ignore"})
          .add("schedule", &O::schedule, "one_shot at start_epoch, iterative (equal steps) or agp (Zhu & Gupta 2017) "
                                         "until end_epoch", {"one_shot", "iterative", "agp"})
          .add("update_frequency", &O::update_frequency, "iterative/agp: epochs between pruning steps")
          .in_range(Range::above(0))
          .add("initial_sparsity", &O::initial_sparsity, "agp: the starting value s_i")
          .in_range(Range::half_open(0, 1));
  return schema;
}

const OptionsSchema<BnSparsityOptions>& bn_sparsity_schema() {
  static const OptionsSchema<BnSparsityOptions> schema =
      OptionsSchema<BnSparsityOptions>()
          .add("penalty", &BnSparsityOptions::penalty, "s of the loss term s·Σ|γ| (network slimming: 1e-4 to 1e-5)")
          .in_range(Range::at_least(0));
  return schema;
}

void register_prune_modifiers() {
  ModifierInfo p;
  p.name = "prune";
  p.description = "channel pruning with physical removal: one-shot, iterative or AGP schedules (docs/pruning.md)";
  p.settings = prune_modifier_schema().keys();
  p.create = [](const ModifierSpec& spec) {
    return std::make_unique<PruneModifier>(spec, prune_modifier_schema().parse(spec.settings, spec.location + ": modifier 'prune'"));
  };
  // "pruned L1 (50 % MACs)", "pruned FPGM (sparsity 0.3)".
  p.label = [](const ModifierSpec& spec) {
    const PruneModifierOptions o = prune_modifier_schema().parse(spec.settings, spec.location + ": modifier 'prune'");
    std::string criterion = o.criterion;
    std::transform(criterion.begin(), criterion.end(), criterion.begin(), ::toupper);
    auto percent = [](double f) {
      std::ostringstream os;
      os << std::fixed << std::setprecision(0) << 100 * f;
      return os.str();
    };
    const std::string what = o.target_macs     ? percent(*o.target_macs) + " % MACs"
                             : o.target_params ? percent(*o.target_params) + " % params"
                                               : "sparsity " + number_text(o.sparsity);
    return "pruned " + criterion + " (" + what + ")";
  };
  register_modifier(std::move(p));
  ModifierInfo b;
  b.name = "bn_sparsity";
  b.description = "network slimming's L1 penalty on BN scaling factors, for pruning with criterion bn_scale";
  b.settings = bn_sparsity_schema().keys();
  b.create = [](const ModifierSpec& spec) {
    return std::make_unique<BnSparsityModifier>(spec, bn_sparsity_schema().parse(spec.settings, spec.location + ": modifier 'bn_sparsity'"));
  };
  register_modifier(std::move(b));
}

}  // namespace whittle::runner
