#include "runner/quantize_modifier.h"

#include <iostream>

#include "core/error.h"
#include "quantize/quantize.h"
#include "runner/modifier.h"

namespace whittle::runner {

namespace {

// Attaches the quantizers when its window opens (on_start when start_epoch is 0, otherwise at the
// first epoch inside the window) and, for BNN, clips the latent weights to [−1, 1] after every
// optimizer step. The quantizers stay attached to the end (end_epoch only ends the clipping).
class QuantizeModifier : public Modifier {
 public:
  explicit QuantizeModifier(const ModifierSpec& spec) : Modifier(spec) {
    const YAML::Node& s = spec.settings;
    auto where = [&](const char* key) { return spec.location + ": modifier 'quantize', key '" + key + "'"; };
    try {
      if (s["method"]) config_.method = s["method"].as<std::string>();
      if (s["weight_bits"]) config_.weight_bits = s["weight_bits"].as<int64_t>();
      if (s["activation_bits"]) config_.activation_bits = s["activation_bits"].as<int64_t>();
      if (s["activation_clip"]) config_.activation_clip = s["activation_clip"].as<double>();
      if (s["granularity"]) config_.granularity = quantize::granularity_from_name(s["granularity"].as<std::string>());
      if (s["xnor_detach_alpha"]) config_.xnor_detach_alpha = s["xnor_detach_alpha"].as<bool>();
      if (s["xnor_scale_k"]) config_.xnor_scale_k = s["xnor_scale_k"].as<bool>();
      if (s["clip_latent_weights"]) clip_ = s["clip_latent_weights"].as<bool>();
    } catch (const YAML::Exception& e) {
      throw Error(where("settings") + ": " + e.what(), ErrorKind::kUsage);
    }
    config_.targets = spec.targets;
    config_.ignore = spec.ignore;
    try {
      config_ = quantize::resolve(config_);
    } catch (const Error& e) {
      throw Error(spec.location + ": modifier 'quantize': " + e.what(), ErrorKind::kUsage);
    }
    clip_ = clip_ && config_.method == "bnn" && config_.weight_bits == 1;
  }

  void on_start(TrainContext& tc) override {
    if (spec().start_epoch <= 0) attach(tc);
  }
  void on_epoch_begin(TrainContext& tc) override {
    if (!applied_ && active_at(tc.epoch)) attach(tc);
  }
  void on_step_end(TrainContext& tc) override {
    if (applied_ && clip_) quantize::clip_latent_weights(tc.model->graph());
  }

 private:
  void attach(TrainContext& tc) {
    quantize::Report r = quantize::apply(tc.model, config_);
    applied_ = true;
    tc.parameters_changed = true;
    std::cout << "quantize (" << config_.method << ", W" << config_.weight_bits << "A" << config_.activation_bits;
    if (config_.activation_clip != 1.0) std::cout << ", activation_clip " << config_.activation_clip;
    std::cout << "): " << r.summary() << std::flush;
  }

  quantize::Config config_;
  bool clip_ = true;
  bool applied_ = false;
};

}  // namespace

void register_quantize_modifier() {
  ModifierInfo info;
  info.name = "quantize";
  info.description = "quantization-aware training: DoReFa, TWN, BNN or XNOR-Net quantizers on conv/linear layers";
  info.settings = {
      KeySpec{"method", KeyType::kString, "dorefa", "dorefa, twn, bnn or xnor", {}, {"dorefa", "twn", "bnn", "xnor"}},
      KeySpec{"weight_bits", KeyType::kInt, "method default (dorefa 8, twn 2, bnn/xnor 1)",
              "weight bits: dorefa 1..8 or 32, twn 2, bnn/xnor 1 or 32", {}, {}},
      KeySpec{"activation_bits", KeyType::kInt, "method default (dorefa 8, twn 32, bnn/xnor 1)",
              "activation bits: dorefa/twn 1..8 or 32, bnn/xnor 1 or 32", {}, {}},
      KeySpec{"activation_clip", KeyType::kFloat, "1",
              "dorefa/twn activations: clip level c of c·quantize_k(clip(a, 0, c)/c) (1: the paper's [0, 1])", {}, {}},
      KeySpec{"granularity", KeyType::kString, "per_channel for twn/xnor, per_tensor for dorefa",
              "scale granularity of twn, xnor and 1-bit dorefa (and dorefa's max)", {}, {"per_tensor", "per_channel"}},
      KeySpec{"xnor_detach_alpha", KeyType::kBool, "false", "xnor: no gradient through α = mean|W|", {}, {}},
      KeySpec{"xnor_scale_k", KeyType::kBool, "false", "xnor: scale each binarized layer's output by K", {}, {}},
      KeySpec{"clip_latent_weights", KeyType::kBool, "true", "bnn: clip latent weights to [-1, 1] after each step", {}, {}},
  };
  info.create = [](const ModifierSpec& spec) { return std::make_unique<QuantizeModifier>(spec); };
  register_modifier(std::move(info));
}

}  // namespace whittle::runner
