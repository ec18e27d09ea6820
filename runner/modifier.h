#pragma once
// Modifiers: the compression methods a recipe schedules (quantize, prune, distill, fuse...). Each
// registers a name, a description, its settings schema and a factory; the trainer calls its hooks.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/registry.h"
#include "graph/graph_module.h"
#include "runner/recipe.h"

namespace whittle::runner {

/// What the trainer lends a modifier's hooks. A modifier that changes the graph (adds quantizer
/// nodes, removes channels) calls model->sync() and sets `parameters_changed`; after the hook the
/// trainer moves the model to `device` and rebuilds the optimizer over the new parameter set
/// (rebuild_optimizer: same hyper-parameters, and the per-parameter state, such as momentum, of
/// every parameter tensor that is still there).
struct TrainContext {
  GraphModule model{nullptr};
  torch::optim::Optimizer* optimizer = nullptr;  ///< nullptr in on_start (built after it)
  const Recipe* recipe = nullptr;
  at::Device device = at::kCPU;  ///< where the model trains
  double epoch = 0.0;        ///< fractional epoch (epoch index + fraction of its batches done)
  int64_t epoch_index = 0;   ///< current epoch, 0-based
  int64_t step = 0;          ///< optimizer steps done so far
  bool parameters_changed = false;
  /// In on_loss: the student's values the active modifiers asked for (captures()), by name, from
  /// this batch's forward pass; nullptr when none asked.
  const std::map<std::string, at::Tensor>* features = nullptr;
  /// In on_step_begin: this batch's input [N, C, H, W] on `device`, as the forward pass will see it.
  const at::Tensor* input = nullptr;
  /// In on_step_begin: the input of training batch `i` counted from this one (i = 0 is `input`;
  /// wrapping around the epoch) on `device`, built as the training pass builds it, for modifiers
  /// that calibrate from several batches. Empty outside on_step_begin.
  std::function<at::Tensor(int64_t i)> train_batch;
  /// Where modifiers print what they did (std::cout; nothing on data-parallel ranks other than 0).
  std::ostream* log = &std::cout;
  /// Data-parallel runs: sums a tensor in place over the ranks (every rank calls it with the same
  /// shapes in the same order). A modifier whose decision depends on the batches it saw (Taylor
  /// scores) sums its evidence with it, so every rank makes the same change. Empty in one process.
  std::function<void(at::Tensor&)> replica_sum;
  /// Data-parallel runs: this process's rank (0 in one process).
  int64_t rank = 0;
  /// The training batches of an epoch (this rank's): what train_batch reaches before it wraps.
  int64_t train_batches = 0;
};

/// Base class of modifiers. Hooks default to doing nothing.
class Modifier {
 public:
  explicit Modifier(ModifierSpec spec) : spec_(std::move(spec)) {}
  virtual ~Modifier() = default;
  const ModifierSpec& spec() const { return spec_; }
  /// Whether the modifier's epoch window [start_epoch, end_epoch) contains `epoch` (end −1: open).
  bool active_at(double epoch) const {
    return epoch >= spec_.start_epoch && (spec_.end_epoch < 0 || epoch < spec_.end_epoch);
  }

  /// Once, before the first epoch, and again after a resume (on the restored model, after
  /// load_state): a modifier that already changed the graph must not do so again.
  virtual void on_start(TrainContext&) {}
  /// The epoch's first hook; not called again when a run resumes in the middle of the epoch.
  virtual void on_epoch_begin(TrainContext&) {}
  virtual void on_epoch_end(TrainContext&) {}
  /// Before every training batch, with tc.epoch the batch's fractional epoch (epoch index +
  /// batch / batches), whatever the window: where a window that opens inside an epoch
  /// (start_epoch 1.5) takes effect, at the first batch whose epoch reaches it.
  virtual void on_step_begin(TrainContext&) {}
  /// After every optimizer step (e.g. BNN's latent weight clipping).
  virtual void on_step_end(TrainContext&) {}
  /// May replace the training loss of a batch (e.g. distillation); `input` N×C×H×W, `target` [N],
  /// `logits` [N, classes]. Returns the loss to back-propagate.
  virtual at::Tensor on_loss(TrainContext&, const at::Tensor& loss, const at::Tensor& /*input*/,
                             const at::Tensor& /*target*/, const at::Tensor& /*logits*/) {
    return loss;
  }
  /// Once, after the last epoch and before the final checkpoint is written.
  virtual void on_finish(TrainContext&) {}
  /// Why this entry cannot act in a run of 0 epochs, "" when it can. Such a run (training.epochs
  /// 0: calibration only) calls on_start, on_epoch_begin and one on_step_begin (the first training
  /// batch, with the evaluation transforms, in eval mode, no gradients) and then on_finish: no loss,
  /// no optimizer step. The default: the entry needs training.
  virtual std::string needs_training() const { return "it acts on the training loss or the optimizer steps"; }
  /// For a run of 0 epochs that this modifier accepts: what it leaves at a value no data set (printed
  /// as a note), or "" when nothing.
  virtual std::string without_training_note() const { return ""; }
  /// The student's graph values (node or value names) this modifier reads in on_loss through
  /// TrainContext::features while it is active (distillation's feature pairs); none by default.
  virtual std::vector<std::string> captures() const { return {}; }
  /// Trainable tensors the modifier owns beside the model's (distillation's hint adapters),
  /// created by on_start: the optimizer updates them with the model's parameters (after those, in
  /// recipe order), and gradient clipping and the loss scaler see them too. None by default.
  virtual std::vector<at::Tensor> parameters() { return {}; }
  /// The graph modules that hold parameters() (the hint adapters), so the optimizer can ask the
  /// registry which of those are normalization γ and β (norm_weight_decay). None by default.
  virtual std::vector<GraphModule> parameter_modules() { return {}; }
  /// Every tensor the modifier owns (its parameters and buffers, e.g. the adapters' BN running
  /// statistics), by a name unique within the modifier: saved with the training state and copied
  /// back in place on resume, after on_start. None by default.
  virtual std::vector<std::pair<std::string, at::Tensor>> state_tensors() { return {}; }
  /// At each epoch's end, after on_epoch_end: adds the modifier's per-epoch figures (the mean of
  /// each loss term over the epoch's batches, e.g. "kd_loss") to `metrics`, which goes into the
  /// epoch's line of metrics.jsonl; then starts the next epoch's sums. None by default.
  virtual void epoch_metrics(std::map<std::string, double>& /*metrics*/) {}

  /// The layers this entry rewrites in `graph` (the model as loaded, before any modifier ran), which
  /// no other entry of the same modifier kind may also claim: checked before the first epoch, so
  /// that two `quantize` entries on one layer are refused naming both, not at the second one's
  /// epoch. Throws whittle::Error (usage) naming the entry when it would rewrite no layer. Default:
  /// none (the modifier claims nothing).
  virtual std::vector<std::string> claimed_layers(const Graph& /*graph*/) const { return {}; }
  /// Whether this entry may claim layers `earlier` (an entry of the same modifier kind) claims too:
  /// a later stage of the same method that takes them over (progressive bit widths). Default: no.
  virtual bool takes_over(const Modifier& /*earlier*/) const { return false; }
  /// When this entry would be a later stage of `earlier` but for its other settings: what it lacks,
  /// for the refusal, items separated by "; " (e.g. "the same targets; the same settings (that
  /// entry: …; this one: …)"); "" when it is a stage, or no candidate for one. Default: "".
  virtual std::string stage_mismatch(const Modifier& /*earlier*/) const { return ""; }

  /// The modifier's own state as JSON text (what it has done so far: applied, frozen, pruned
  /// fraction...), saved with the training state; "" (the default) when it has none.
  virtual std::string state() const { return ""; }
  /// Restores what state() returned, on resume, before on_start. The default ignores it. Throws
  /// whittle::Error for text it cannot read.
  virtual void load_state(const std::string& /*state*/) {}

 private:
  ModifierSpec spec_;
};

/// A modifier kind: its recipe name, a one-line description, its settings (validated before any
/// work starts; an OptionsSchema's keys(), runner/modifier_options.h) and a factory, which turns
/// the entry's ModifierSpec (settings typed by that schema) into the modifier, throwing
/// whittle::Error (usage) naming spec.location for settings it refuses.
struct ModifierInfo {
  std::string name;
  std::string description;
  std::vector<KeySpec> settings;
  /// When set, the settings as of now, used instead of `settings`: for a modifier whose keys come
  /// from another registry (the quantize modifier's, from its methods), which may grow after the
  /// modifier registered. Read them through modifier_settings().
  std::function<std::vector<KeySpec>()> settings_now;
  std::function<std::unique_ptr<Modifier>(const ModifierSpec&)> create;
  /// What an entry does, in a few words, for reports and their legends ("DoReFa W2A2", "pruned L1
  /// (50 % MACs)", "KD"); empty: the modifier's name. Read it through modifier_label().
  std::function<std::string(const ModifierSpec&)> label;
};

/// The modifier registry ("modifiers" in `whittle inspect`).
Registry<ModifierInfo>& modifiers();
/// The settings of `info` (ModifierInfo::settings_now when set, else ModifierInfo::settings).
std::vector<KeySpec> modifier_settings(const ModifierInfo& info);
/// The label of a recipe entry (ModifierInfo::label, or its name); throws like modifier_info.
std::string modifier_label(const ModifierSpec& spec);
/// Registers (or replaces) a modifier kind.
void register_modifier(ModifierInfo info);
/// The modifier kind `name`; throws whittle::Error (usage) listing the known modifiers.
const ModifierInfo& modifier_info(const std::string& name);
/// Registered modifier names, sorted.
std::vector<std::string> modifier_names();

/// Registers the modifiers that ship with whittle (idempotent). load_recipe and run_recipe call
/// it; a program registering its own modifiers may call it first.
void register_builtin_modifiers();

/// The state (Modifier::state) of a modifier that changes the graph once: {"applied": <applied>}.
std::string applied_state(bool applied);
/// Reads applied_state()'s text. Throws whittle::Error "<where>: unreadable saved state '<text>':
/// ..." for anything else (`where`: "<location>: modifier '<name>'").
bool parse_applied_state(const std::string& text, const std::string& where);

}  // namespace whittle::runner
