#include "runner/quantize_modifier.h"

#include <nlohmann/json.hpp>

#include <iostream>

#include "core/error.h"
#include "quantize/quantize.h"
#include "runner/modifier.h"

namespace whittle::runner {

namespace {

// Attaches the quantizers when its window opens (on_start when start_epoch is 0, otherwise at the
// first batch inside the window, which for a whole start_epoch is the epoch's first) and, for BNN, clips the latent weights to [−1, 1] after every
// optimizer step. The quantizers stay attached to the end (end_epoch only ends the clipping).
class QuantizeModifier : public Modifier {
 public:
  QuantizeModifier(const ModifierSpec& spec, const QuantizeModifierOptions& o) : Modifier(spec) {
    config_.method = o.method;
    if (o.weight_bits) config_.weight_bits = *o.weight_bits;
    if (o.activation_bits) config_.activation_bits = *o.activation_bits;
    config_.activation_clip = o.activation_clip;
    config_.xnor_detach_alpha = o.xnor_detach_alpha;
    config_.xnor_scale_k = o.xnor_scale_k;
    config_.targets = spec.targets;
    config_.ignore = spec.ignore;
    try {
      if (o.granularity) config_.granularity = quantize::granularity_from_name(*o.granularity);
      config_ = quantize::resolve(config_);
    } catch (const Error& e) {
      throw Error(spec.location + ": modifier 'quantize': " + e.what(), ErrorKind::kUsage);
    }
    clip_ = o.clip_latent_weights && config_.method == "bnn" && config_.weight_bits == 1;
    // Settings that would change nothing are refused rather than ignored.
    auto refuse = [&](const std::string& why) {
      throw Error(spec.location + ": modifier 'quantize': " + why, ErrorKind::kUsage);
    };
    if (spec.end_epoch >= 0)
      refuse("end_epoch " + SettingValue(spec.end_epoch).text() +
             ": the quantizers stay attached to the end of the run (leave end_epoch out)");
    if (config_.weight_bits == 32 && config_.activation_bits == 32)
      refuse("weight_bits and activation_bits are both 32: nothing would be quantized");
    const auto& given = spec.settings;
    if (given.contains("clip_latent_weights") && config_.method != "bnn")
      refuse("clip_latent_weights applies to method bnn, not " + config_.method);
    for (const char* key : {"xnor_detach_alpha", "xnor_scale_k"})
      if (given.contains(key) && config_.method != "xnor") refuse(std::string(key) + " applies to method xnor, not " + config_.method);
    if (given.contains("granularity") && config_.method == "bnn")
      refuse("granularity: method bnn has no weight scale (sign(W) only)");
  }

  void on_start(TrainContext& tc) override {
    if (!applied_ && spec().start_epoch <= 0) attach(tc);
  }
  void on_epoch_begin(TrainContext& tc) override {
    if (!applied_ && active_at(tc.epoch)) attach(tc);
  }
  // A window opening inside an epoch (start_epoch 1.5) attaches at that epoch's first batch past it.
  void on_step_begin(TrainContext& tc) override {
    if (!applied_ && active_at(tc.epoch)) attach(tc);
  }
  void on_step_end(TrainContext& tc) override {
    if (applied_ && clip_) quantize::clip_latent_weights(tc.model->graph());
  }

  std::string state() const override { return nlohmann::json{{"applied", applied_}}.dump(); }
  void load_state(const std::string& text) override {
    try {
      applied_ = nlohmann::json::parse(text).at("applied").get<bool>();
    } catch (const std::exception& e) {
      throw Error(spec().location + ": modifier 'quantize': unreadable saved state '" + text + "': " + e.what());
    }
  }

 private:
  void attach(TrainContext& tc) {
    quantize::Report r = quantize::apply(tc.model, config_);
    if (r.quantized.empty())
      throw Error(spec().location + ": modifier 'quantize' quantized no layer: " +
                      (r.skipped.empty() ? std::string("its targets select no conv or linear layer")
                                         : "every selected layer was skipped (" + r.skipped.front() +
                                               (r.skipped.size() > 1 ? ", ..." : "") + ")"),
                  ErrorKind::kUsage);
    applied_ = true;
    tc.parameters_changed = true;
    *tc.log << "quantize (" << config_.method << ", W" << config_.weight_bits << "A" << config_.activation_bits;
    if (config_.activation_clip != 1.0) *tc.log << ", activation_clip " << config_.activation_clip;
    *tc.log << "): " << r.summary() << std::flush;
  }

  quantize::Config config_;
  bool clip_ = true;
  bool applied_ = false;
};

}  // namespace

const OptionsSchema<QuantizeModifierOptions>& quantize_modifier_schema() {
  using O = QuantizeModifierOptions;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .add("method", &O::method, "dorefa, twn, bnn or xnor", {"dorefa", "twn", "bnn", "xnor"})
          .add("weight_bits", &O::weight_bits, "weight bits: dorefa 1..8 or 32, twn 2, bnn/xnor 1 or 32", {},
               "method default (dorefa 8, twn 2, bnn/xnor 1)")
          .in_range(Range::closed(1, 32))
          .add("activation_bits", &O::activation_bits, "activation bits: dorefa/twn 1..8 or 32, bnn/xnor 1 or 32", {},
               "method default (dorefa 8, twn 32, bnn/xnor 1)")
          .in_range(Range::closed(1, 32))
          .add("activation_clip", &O::activation_clip,
               "dorefa/twn activations: clip level c of c·quantize_k(clip(a, 0, c)/c) (1: the paper's [0, 1])")
          .in_range(Range{0, 1e6, true, false})
          .add("granularity", &O::granularity, "scale granularity of twn, xnor and 1-bit dorefa (and dorefa's max)",
               {"per_tensor", "per_channel"}, "per_channel for twn/xnor, per_tensor for dorefa")
          .add("xnor_detach_alpha", &O::xnor_detach_alpha, "xnor: no gradient through α = mean|W|")
          .add("xnor_scale_k", &O::xnor_scale_k, "xnor: scale each binarized layer's output by K")
          .add("clip_latent_weights", &O::clip_latent_weights, "bnn: clip latent weights to [-1, 1] after each step");
  return schema;
}

void register_quantize_modifier() {
  ModifierInfo info;
  info.name = "quantize";
  info.description = "quantization-aware training: DoReFa, TWN, BNN or XNOR-Net quantizers on conv/linear layers";
  info.settings = quantize_modifier_schema().keys();
  info.create = [](const ModifierSpec& spec) {
    return std::make_unique<QuantizeModifier>(
        spec, quantize_modifier_schema().parse(spec.settings, spec.location + ": modifier 'quantize'"));
  };
  register_modifier(std::move(info));
}

}  // namespace whittle::runner
