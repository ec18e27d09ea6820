#include "runner/fuse_modifier.h"

#include <nlohmann/json.hpp>

#include <iostream>
#include <utility>
#include <vector>

#include "fuse/fuse.h"
#include "core/error.h"
#include "runner/modifier.h"

namespace whittle::runner {

namespace {

// mode inference: at the end of training, in eval form, runs fuse::fuse_for_inference (RepVGG
// merging, BN folding, BN→threshold as configured), so the checkpoint holds no foldable BN.
// mode qat: when its window opens, turns layer+BN pairs into conv_bn_qat nodes (after the quantize
// modifier attached its quantizers, which then see the folded weight); freezes the BN statistics
// at freeze_bn_epoch; at the end folds for good (finalize_qat_batchnorm, then the inference passes).
class FuseBatchNormModifier : public Modifier {
 public:
  FuseBatchNormModifier(const ModifierSpec& spec, const FuseBatchNormModifierOptions& o)
      : Modifier(spec), mode_(o.mode), freeze_epoch_(o.freeze_bn_epoch) {
    options_.repvgg = o.repvgg;
    options_.threshold = o.threshold;
    if (mode_ != "inference" && mode_ != "qat")
      throw Error(where() + ", key 'mode': '" + mode_ + "' is not one of inference, qat", ErrorKind::kUsage);
    if (freeze_epoch_ < 0 && freeze_epoch_ != -1.0)
      throw Error(where() + ", key 'freeze_bn_epoch': " + SettingValue(freeze_epoch_).text() +
                      " is neither an epoch (≥ 0) nor −1 (never)",
                  ErrorKind::kUsage);
    if (mode_ == "inference" && freeze_epoch_ >= 0)
      throw Error(where() + ", key 'freeze_bn_epoch': applies to mode qat only", ErrorKind::kUsage);
    options_.targets = spec.targets;
    options_.ignore = spec.ignore;
  }

  void on_start(TrainContext& tc) override {
    // A run of 0 epochs (calibration only) folds at once, so that the quantizers that follow are
    // calibrated on the folded layers, as `whittle calibrate` does.
    if (mode_ == "inference" && tc.recipe && tc.recipe->training.epochs == 0) {
      check_fold_first(tc);
      fold(tc);
      return;
    }
    if (mode_ != "qat") return;
    check_order(tc);
    if (!prepared_ && spec().start_epoch <= 0) prepare(tc);
  }

  void on_epoch_begin(TrainContext& tc) override { advance(tc); }
  // Windows and freeze_bn_epoch may fall inside an epoch: checked before every batch too.
  void on_step_begin(TrainContext& tc) override { advance(tc); }

  void on_finish(TrainContext& tc) override {
    if (!folded_) fold(tc);
  }

  std::string needs_training() const override {
    return mode_ == "qat" ? "mode qat simulates the folding while training; mode inference folds without training" : "";
  }

  std::string state() const override {
    return nlohmann::json{{"prepared", prepared_}, {"frozen", frozen_}}.dump();
  }
  void load_state(const std::string& text) override {
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      prepared_ = j.at("prepared").get<bool>();
      frozen_ = j.at("frozen").get<bool>();
    } catch (const std::exception& e) {
      throw Error(where() + ": unreadable saved state '" + text + "': " + e.what());
    }
  }

 private:
  std::string where() const { return spec().location + ": modifier 'fuse_batchnorm'"; }

  // The quantizers must be on the layers before they are folded (quantize skips conv_bn_qat
  // nodes), so a quantize modifier must come earlier in the list and start no later.
  void check_order(const TrainContext& tc) const {
    for (const auto& [m, before] : quantize_entries(tc))
      if (!before || m->start_epoch > spec().start_epoch)
        throw Error(where() + ": mode qat folds the BN into the layers, so the 'quantize' modifier (line " +
                        std::to_string(m->line) + ") must come before it in the modifiers list and start no later",
                    ErrorKind::kUsage);
  }

  // The recipe's quantize entries, each with whether it comes before this entry in the list.
  std::vector<std::pair<const ModifierSpec*, bool>> quantize_entries(const TrainContext& tc) const {
    std::vector<std::pair<const ModifierSpec*, bool>> out;
    if (!tc.recipe) return out;
    bool before = true;
    for (const auto& m : tc.recipe->modifiers) {
      if (m.line == spec().line && m.name == spec().name) before = false;
      else if (m.name == "quantize") out.emplace_back(&m, before);
    }
    return out;
  }

  void fold(TrainContext& tc) {
    tc.model->eval();
    fuse::Report r = fuse::fuse_for_inference(tc.model, options_);
    tc.parameters_changed = true;
    folded_ = true;
    *tc.log << r.summary() << std::flush;
  }

  // Calibration only: a quantize entry before this one would have put its quantizers on the layers
  // already, and a quantized layer's weight takes no BN folded into it.
  void check_fold_first(const TrainContext& tc) const {
    for (const auto& [m, before] : quantize_entries(tc))
      if (before)
        throw Error(where() + ": with training.epochs 0 (calibration only) the batch norms fold before the layers "
                        "are quantized, so it must come before the 'quantize' modifier (line " +
                        std::to_string(m->line) + ") in the modifiers list",
                    ErrorKind::kUsage);
  }

  // Prepares when the window has opened and freezes when freeze_bn_epoch has come (epoch tc.epoch).
  void advance(TrainContext& tc) {
    if (mode_ != "qat") return;
    if (!prepared_ && active_at(tc.epoch)) prepare(tc);
    if (prepared_ && !frozen_ && freeze_epoch_ >= 0 && tc.epoch >= freeze_epoch_) {
      const int64_t n = fuse::freeze_qat_batchnorm(tc.model->graph());
      tc.model->sync();  // the parameters stay the same tensors, so the optimizer keeps its state
      frozen_ = true;
      *tc.log << "fuse_batchnorm: BN statistics frozen in " << n << " layers at epoch " << tc.epoch << "\n" << std::flush;
    }
  }

  void prepare(TrainContext& tc) {
    fuse::QatOptions q;
    q.targets = options_.targets;
    q.ignore = options_.ignore;
    fuse::Report r = fuse::prepare_qat_batchnorm(tc.model, q);
    prepared_ = true;
    tc.parameters_changed = true;
    *tc.log << r.summary() << std::flush;
  }

  std::string mode_;
  bool folded_ = false;  ///< mode inference: folded already (at the start of a run of 0 epochs)
  double freeze_epoch_;
  fuse::InferenceOptions options_;
  bool prepared_ = false;
  bool frozen_ = false;
};

}  // namespace

const OptionsSchema<FuseBatchNormModifierOptions>& fuse_modifier_schema() {
  using O = FuseBatchNormModifierOptions;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .add("mode", &O::mode,
               "inference: fold at the end of training (in a run of 0 epochs, at its start, before the quantizers calibrate); qat: train with the folded weight (batch statistics with "
               "the σ_running/σ_batch correction) so the quantizers see it, fold for good at the end",
               {"inference", "qat"})
          .add("freeze_bn_epoch", &O::freeze_bn_epoch,
               "qat: from this epoch on, train with the running statistics and stop updating them (−1: never)", {},
               "never")
          .in_range(Range::at_least(-1))
          .add("repvgg", &O::repvgg, "at the end, also merge RepVGG blocks into single 3×3 convs")
          .add("threshold", &O::threshold, "at the end, also turn BN + sign binarizer into thresholds");
  return schema;
}

void register_fuse_modifier() {
  ModifierInfo info;
  info.name = "fuse_batchnorm";
  info.description = "BN folding: for inference at the end of training, or simulated during QAT (mode: qat)";
  info.settings = fuse_modifier_schema().keys();
  info.create = [](const ModifierSpec& spec) {
    return std::make_unique<FuseBatchNormModifier>(
        spec, fuse_modifier_schema().parse(spec.settings, spec.location + ": modifier 'fuse_batchnorm'"));
  };
  info.label = [](const ModifierSpec&) { return std::string("BN fused"); };
  register_modifier(std::move(info));
}

}  // namespace whittle::runner
