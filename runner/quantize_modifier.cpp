#include "runner/quantize_modifier.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <iostream>

#include "core/error.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "runner/modifier.h"

namespace whittle::runner {

namespace {

// The quantize pass's configuration of a recipe entry, resolved by its method (defaults filled in,
// its options checked). Throws whittle::Error (usage) naming the entry.
quantize::Config entry_config(const ModifierSpec& spec) {
  // The keys every method has; the rest are the method's own (checked by its resolve).
  Settings common, method_options;
  for (const auto& [key, value] : spec.settings.values())
    (quantize_modifier_schema().has(key) ? common : method_options)[key] = value;
  const QuantizeModifierOptions o = quantize_modifier_schema().parse(common, spec.location + ": modifier 'quantize'");
  quantize::Config c;
  c.method = o.method;
  if (o.weight_bits) c.weight_bits = *o.weight_bits;
  if (o.activation_bits) c.activation_bits = *o.activation_bits;
  c.options = method_options;
  c.targets = spec.targets;
  c.ignore = spec.ignore;
  try {
    return quantize::resolve(c);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.rfind("quantize: ", 0) == 0) what = what.substr(10);  // said once, in the prefix
    throw Error(spec.location + ": modifier 'quantize': " + what, ErrorKind::kUsage);
  }
}

// Attaches the quantizers when its window opens (on_start when start_epoch is 0, otherwise at the
// first batch inside the window, which for a whole start_epoch is the epoch's first) and, for BNN, clips the latent weights to [−1, 1] after every
// optimizer step. The quantizers stay attached to the end (end_epoch only ends the clipping).
class QuantizeModifier : public Modifier {
 public:
  explicit QuantizeModifier(const ModifierSpec& spec) : Modifier(spec), config_(entry_config(spec)) {
    // Settings that would change nothing are refused rather than ignored.
    auto refuse = [&](const std::string& why) {
      throw Error(spec.location + ": modifier 'quantize': " + why, ErrorKind::kUsage);
    };
    if (spec.end_epoch >= 0)
      refuse("end_epoch " + SettingValue(spec.end_epoch).text() +
             ": the quantizers stay attached to the end of the run (leave end_epoch out)");
    if (config_.weight_bits == 32 && config_.activation_bits == 32)
      refuse("weight_bits and activation_bits are both 32: nothing would be quantized");
  }

  void on_start(TrainContext& tc) override {
    // The span of the method's schedule (EDE's): the whole run, whichever stage entry calls it, so
    // that the stages of one run agree on it.
    config_.schedule_start_epoch = 0.0;
    if (tc.recipe) config_.schedule_end_epoch = static_cast<double>(tc.recipe->training.epochs);
    if (!applied_ && spec().start_epoch <= 0) attach(tc);
  }
  void on_epoch_begin(TrainContext& tc) override {
    if (!applied_ && active_at(tc.epoch)) attach(tc);
  }
  // A window opening inside an epoch (start_epoch 1.5) attaches at that epoch's first batch past it.
  void on_step_begin(TrainContext& tc) override {
    if (!applied_ && active_at(tc.epoch)) attach(tc);
    if (applied_)
      if (const int64_t changed = quantize::at_epoch(tc.model->graph(), config_, tc.epoch); changed > 0)
        *tc.log << "quantize (" << config_.method << "): schedule at epoch " << tc.epoch << " changed " << changed
                << " node(s)\n" << std::flush;
    if (!to_initialize_.empty() && tc.input) initialize(tc);
  }
  void on_step_end(TrainContext& tc) override {
    if (!applied_) return;
    quantize::after_step(tc.model->graph(), config_);
    // Data-parallel runs: buffers that followed this rank's batches (int8's observers) become the
    // mean over the ranks, so that every rank quantizes the next batch on the same grid.
    if (tc.replica_sum) {
      if (ranks_ == 0) {
        at::Tensor one = at::ones({1}, at::TensorOptions().device(tc.device).dtype(at::kDouble));
        tc.replica_sum(one);
        ranks_ = static_cast<int64_t>(std::llround(one.item<double>()));
      }
      quantize::sync_replicas(tc.model->graph(), tc.replica_sum, ranks_);
    }
  }
  // Attached in on_start, its steps or scales from the method's calibrator at the first batch: a
  // run of 0 epochs is post-training quantization.
  std::string needs_training() const override { return ""; }
  // Learned activation parameters with neither a calibrator nor a rule from data (PACT's clips
  // without clip_calibrator) keep the values they were created with when nothing trains.
  std::string without_training_note() const override {
    const quantize::QuantizerMethod& method = quantize::quantizer_method(config_.method);
    const std::optional<quantize::ActivationPlan> plan = method.activations(config_);
    if (!plan || method.calibration(config_)) return "";
    const quantize::ActivationQuantizer& q = quantize::activation_quantizers().get(plan->quantizer);
    if (q.params.empty() || q.initialize) return "";
    std::string params;
    for (const auto& p : q.params) params += (params.empty() ? "" : ", ") + p;
    return "method '" + config_.method + "' learns its activation parameters (" + params +
           ") in training; without a calibrator they keep their initial values in a run of 0 epochs" +
           (q.calibrate ? " (its calibrator option, docs/recipes.md, sets them from data)" : "");
  }
  // The method's loss term (PACT's penalty on its clip levels), while its quantizers are attached.
  at::Tensor on_loss(TrainContext& tc, const at::Tensor& loss, const at::Tensor&, const at::Tensor&,
                     const at::Tensor&) override {
    if (!applied_) return loss;
    const at::Tensor p = quantize::penalty(tc.model->graph(), config_);
    return p.defined() ? loss + p.to(loss.device(), loss.scalar_type()) : loss;
  }
  std::vector<std::string> claimed_layers(const Graph& graph) const override {
    const quantize::Report r = quantize::select_layers(graph, config_);
    if (r.quantized.empty()) refuse_nothing_quantized(r);
    return r.quantized;
  }

  // A later entry of a method with progressive bit widths takes over an earlier entry's layers.
  // Only the bits may differ: the same method, targets, ignore and options, activations quantized
  // (or not) in both, weights quantized in both or only from the later entry on (at the earlier
  // entry's activation bits), and a later window.
  bool takes_over(const Modifier& earlier) const override {
    return stage_candidate(earlier) && stage_mismatch(earlier).empty();
  }

  std::string stage_mismatch(const Modifier& earlier) const override {
    if (!stage_candidate(earlier)) return "";
    const auto& e = static_cast<const QuantizeModifier&>(earlier);
    const quantize::Config &a = e.config_, &b = config_;
    auto shown = [](const quantize::Config& c) {  // the settings as the message lists them
      std::string t;
      for (const auto& [key, value] : c.options.values()) t += (t.empty() ? "" : ", ") + key + " " + value.text();
      return t.empty() ? std::string("the defaults") : t;
    };
    std::vector<std::string> lacks;
    if (spec().start_epoch <= e.spec().start_epoch)
      lacks.push_back("a start_epoch later than " + number_text(e.spec().start_epoch));
    if (a.targets != b.targets) lacks.push_back("the same targets");
    if (a.ignore != b.ignore) lacks.push_back("the same ignore list");
    if (options_key(a) != options_key(b))
      lacks.push_back("the same settings (that entry: " + shown(a) + "; this one: " + shown(b) + ")");
    // Weights left float by the earlier entry may be quantized from this one on (ReActNet's
    // stages: W32A1, then W1A1); nothing quantized returns to float.
    if (a.weight_bits != 32 && b.weight_bits == 32)
      lacks.push_back("its weights quantized (that entry quantized them to " + std::to_string(a.weight_bits) +
                      " bits; they cannot return to 32)");
    if ((a.activation_bits == 32) != (b.activation_bits == 32))
      lacks.push_back(a.activation_bits == 32 ? "activations left float, as that entry leaves them"
                                              : "its activations quantized (that entry quantized them to " +
                                                    std::to_string(a.activation_bits) + " bits; they cannot return to 32)");
    // The stage that quantizes the weights attaches their quantizers and keeps the activations'.
    if (a.weight_bits == 32 && b.weight_bits != 32 && a.activation_bits != b.activation_bits)
      lacks.push_back("the activation_bits of that entry (" + std::to_string(a.activation_bits) +
                      ") in the stage that quantizes the weights it left at 32 bits");
    std::string out;
    for (size_t i = 0; i < lacks.size(); ++i) out += (i == 0 ? "" : "; ") + lacks[i];
    return out;
  }

  std::string state() const override { return applied_state(applied_); }
  void load_state(const std::string& text) override {
    applied_ = parse_applied_state(text, spec().location + ": modifier 'quantize'");
  }

 private:
  // The options compared for a stage: each of the method's keys as key=value; with the value given,
  // or its default (so that a default written out equals one left out).
  static std::string options_key(const quantize::Config& c) {
    std::string t;
    for (const KeySpec& k : quantize::quantizer_method(c.method).option_keys())
      t += k.name + "=" + (c.options.contains(k.name) ? c.options[k.name].text() : k.default_text) + ";";
    return t;
  }

  // A later entry of the same method, which changes bits: a stage when its other settings agree.
  bool stage_candidate(const Modifier& earlier) const {
    const auto* e = dynamic_cast<const QuantizeModifier*>(&earlier);
    return e && e->config_.method == config_.method && quantize::quantizer_method(config_.method).changes_bits();
  }

  void attach(TrainContext& tc) {
    // A later stage of progressive bit widths changes the bits of the layers an earlier entry
    // quantized, carrying their learned parameters; otherwise the quantizers are attached.
    if (!quantize::quantized_by(tc.model->graph(), config_).empty()) {
      const quantize::Report r = quantize::change_bits(tc.model, config_);
      applied_ = true;
      tc.parameters_changed = true;
      // With a calibrator the steps start from it again: the weights' in change_bits, the
      // activations' over this stage's first batches.
      const bool recalibrate = quantize::quantizer_method(config_.method).calibration(config_).has_value();
      if (recalibrate) to_initialize_ = quantize::input_quantizers(tc.model->graph(), r.quantized);
      *tc.log << "quantize (" << config_.method << "): " << r.quantized.size() << " layers now W" << config_.weight_bits
              << "A" << config_.activation_bits
              << (recalibrate ? ", their steps from the calibrator again\n" : ", their learned parameters carried\n")
              << std::flush;
      return;
    }
    quantize::Report r = quantize::apply(tc.model, config_);
    if (r.quantized.empty()) refuse_nothing_quantized(r);
    applied_ = true;
    to_initialize_ = quantize::nodes_to_initialize(tc.model->graph(), r);  // its own new nodes only
    tc.parameters_changed = true;
    *tc.log << "quantize (" << config_.method << ", W" << config_.weight_bits << "A" << config_.activation_bits;
    for (const auto& [key, value] : config_.options.values()) *tc.log << ", " << key << " " << value.text();
    *tc.log << "): " << r.summary() << std::flush;
  }

  // The learned activation parameters that start from data (LSQ's steps): from the method's
  // calibrator over its first batches (histograms merged over the ranks of a data-parallel run), or
  // from the first batch the quantizers see (averaged over the ranks), so every rank starts alike.
  void initialize(TrainContext& tc) {
    const std::vector<std::string> nodes = std::move(to_initialize_);
    to_initialize_.clear();
    tc.model->to(tc.device);  // attached in this hook: not moved by the trainer yet
    // The method's calibrator over its batches, or its own rule from this batch.
    std::optional<quantize::Calibration> cal = quantize::quantizer_method(config_.method).calibration(config_);
    const at::Tensor first = *tc.input;
    int64_t count = 0;
    // Training wraps around the epoch for more batches than it has; a calibration alone would
    // count the same images twice.
    if (cal && tc.recipe && tc.recipe->training.epochs == 0 && tc.train_batches > 0 && cal->batches > tc.train_batches)
      throw Error(spec().location + ": modifier 'quantize': its " + cal->calibrator + " calibrator reads " +
                      std::to_string(cal->batches) + " batches, but the training split has " +
                      std::to_string(tc.train_batches) + " of " + std::to_string(tc.recipe->data.batch_size) +
                      " images: lower calibration_batches (init_batches for the learned quantizers) or data.batch_size",
                  ErrorKind::kUsage);
    if (cal) {
      // Each rank observes its own batches; the histograms are merged over the ranks, so every
      // rank computes the same values.
      std::function<at::Tensor(int64_t)> batch = tc.train_batch;
      if (!batch) {
        batch = [&](int64_t) { return first; };
        cal->batches = 1;
      }
      std::function<void(quantize::Histogram&)> merge;
      if (tc.replica_sum) {
        at::Tensor ranks = at::ones({1}, at::TensorOptions().device(tc.device));
        tc.replica_sum(ranks);
        const int64_t world = static_cast<int64_t>(ranks.item<double>() + 0.5);
        merge = [&tc, world](quantize::Histogram& h) {
          quantize::merge_over_ranks(
              h,
              [&tc](at::Tensor& t) {
                at::Tensor d = t.to(tc.device);
                tc.replica_sum(d);
                t = d.cpu();
              },
              tc.rank, world);
        };
      }
      count = quantize::calibrate_learned(tc.model, batch, *cal, nodes, merge);
    } else {
      // Only the nodes whose quantizer has a rule of its own (PACT's start from clip_init).
      std::vector<std::string> own_rule;
      for (const auto& name : nodes)
        if (quantize::activation_quantizer_of(tc.model->graph().node(name)).initialize) own_rule.push_back(name);
      if (own_rule.empty()) return;
      count = quantize::initialize_learned(tc.model, first, own_rule);
    }
    if (count == 0) return;
    if (tc.replica_sum && !cal) {
      at::NoGradGuard no_grad;
      at::Tensor ranks = at::ones({1}, at::TensorOptions().device(tc.device));
      tc.replica_sum(ranks);
      for (const auto& node : nodes) {
        const Node& n = tc.model->graph().node(node);
        for (const auto& name : quantize::activation_quantizer_of(n).params) {
          const at::Tensor* p = n.params.find(name);
          if (!p || !p->defined()) continue;
          at::Tensor sum = p->detach().clone();
          tc.replica_sum(sum);
          p->copy_(sum / ranks);
        }
      }
    }
    *tc.log << "quantize: " << count << " activation quantizer(s) initialized "
            << (cal ? "by the " + cal->calibrator + " calibrator over " + std::to_string(cal->batches) + " batch(es)"
                    : std::string("from the first batch"))
            << "\n"
            << std::flush;
  }

  [[noreturn]] void refuse_nothing_quantized(const quantize::Report& r) const {
    throw Error(spec().location + ": modifier 'quantize' quantizes no layer: " +
                    (r.skipped.empty() ? std::string("its targets select no conv or linear layer")
                                       : "every selected layer is skipped (" + r.skipped.front() +
                                             (r.skipped.size() > 1 ? ", ..." : "") + ")"),
                ErrorKind::kUsage);
  }

  quantize::Config config_;
  bool applied_ = false;
  int64_t ranks_ = 0;  ///< data-parallel ranks (counted at the first step that needs them)
  std::vector<std::string> to_initialize_;  ///< act_quant nodes this entry made whose parameters start from data
};

}  // namespace

const OptionsSchema<QuantizeModifierOptions>& quantize_modifier_schema() {
  using O = QuantizeModifierOptions;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .add("method", &O::method, "a registered quantizer method (whittle inspect --methods)")
          .add("weight_bits", &O::weight_bits,
               "weight bits: dorefa/pact 1..8 or 32, lsq/lsq_plus 2..8 or 32, twn 2, bnn/xnor 1 or 32", {},
               "method default (dorefa 8, twn 2, bnn/xnor 1, lsq/lsq_plus/pact 4)")
          .in_range(Range::closed(1, 32))
          .add("activation_bits", &O::activation_bits,
               "activation bits: dorefa/twn/lsq/lsq_plus 1..8 or 32, pact 1..8, bnn/xnor 1 or 32", {},
               "method default (dorefa 8, twn 32, bnn/xnor 1, lsq/lsq_plus/pact 4)")
          .in_range(Range::closed(1, 32));
  return schema;
}

std::vector<KeySpec> quantize_modifier_keys() {
  std::vector<KeySpec> keys = quantize_modifier_schema().keys();
  keys[0].choices = quantize::quantizer_methods().names();  // `method`: checked with the recipe
  const size_t common = keys.size();
  // Per method key: each method that has it, with its description and default.
  struct Owner {
    std::string method, description, default_text;
  };
  std::vector<std::vector<Owner>> owners;
  for (const auto& name : quantize::quantizer_methods().names()) {
    for (const KeySpec& k : quantize::quantizer_methods().get(name).option_keys()) {
      size_t i = common;
      while (i < keys.size() && keys[i].name != k.name) ++i;
      if (i == keys.size()) {
        keys.push_back(k);
        owners.emplace_back();
      }
      owners[i - common].push_back({name, k.description, k.default_text});
    }
  }
  // "dorefa, twn: <description>" when they say the same, "dorefa: ...; xnor: ..." otherwise; the
  // default likewise, grouped by value: "per_tensor (dorefa), per_channel (twn, xnor)".
  auto grouped = [](const std::vector<Owner>& os, std::string Owner::*field, const char* between, bool value_first) {
    std::vector<std::pair<std::string, std::string>> groups;  // value → methods
    for (const Owner& o : os) {
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == o.*field; });
      if (g == groups.end()) groups.push_back({o.*field, o.method});
      else g->second += ", " + o.method;
    }
    std::string out;
    for (const auto& [value, methods] : groups) {
      if (!out.empty()) out += between;
      if (groups.size() == 1 && value_first) return value;
      out += value_first ? value + " (" + methods + ")" : methods + ": " + value;
    }
    return out;
  };
  for (size_t i = common; i < keys.size(); ++i) {
    keys[i].description = grouped(owners[i - common], &Owner::description, "; ", false);
    keys[i].default_text = grouped(owners[i - common], &Owner::default_text, ", ", true);
  }
  return keys;
}

void register_quantize_modifier() {
  ModifierInfo info;
  info.name = "quantize";
  info.description = "quantization-aware training: a registered quantizer method (DoReFa, TWN, BNN, XNOR-Net, ...) on conv/linear layers";
  info.settings_now = &quantize_modifier_keys;
  info.create = [](const ModifierSpec& spec) { return std::make_unique<QuantizeModifier>(spec); };
  // The method's own label at the entry's resolved widths ("DoReFa W2A2", "TWN", "BNN").
  info.label = [](const ModifierSpec& spec) {
    const quantize::Config c = entry_config(spec);
    return quantize::quantizer_method(c.method).label(c);
  };
  register_modifier(std::move(info));
}

}  // namespace whittle::runner
