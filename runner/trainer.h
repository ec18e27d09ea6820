#pragma once
// The training and evaluation loop behind `whittle run`: builds the model and the data from a
// Recipe, trains with the recipe's optimizer and schedule while calling the modifiers' hooks,
// evaluates every epoch, and keeps a run directory:
//
//   <dir>/recipe.yaml      the effective recipe (after --set)
//   <dir>/model.h5         the checkpoint (export/checkpoint.h), rewritten atomically each epoch
//   <dir>/train_state.pt   resumable training state (graph, tensors, optimizer, epoch, RNG state)
//   <dir>/metrics.jsonl    one JSON object per epoch
//   <dir>/report.json      the final report (accuracy, loss, parameters, MACs, bytes, time, images/s)

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <iosfwd>
#include <string>

#include "graph/graph_module.h"
#include "runner/recipe.h"

namespace whittle::data {
class DataLoader;
struct Dataset;
}

namespace whittle::runner {

/// Command-line choices that override the recipe.
struct RunOptions {
  std::string out_dir;   ///< run directory ("" = recipe outputs.dir)
  std::string device;    ///< "" = recipe training.device
  bool resume = false;   ///< continue from <dir>/train_state.pt
  std::ostream* log = nullptr;  ///< progress and report (nullptr = std::cout)
};

/// Loads split `split` of the dataset at `path` (any format data::load_dataset reads). Image
/// folders and image archives decode slowly, so when `pack_to` is not empty they are read through
/// an HDF5 copy `<pack_to>/<name>-<split>.h5`, written on first use (a note goes to `log`) and read
/// from then on. Throws whittle::Error from loading or packing.
data::Dataset load_split(const std::string& path, const std::string& split, const std::string& pack_to,
                         std::ostream& log);

/// The device named `name` ("cpu", "cuda" or "cuda:N"), checked to exist. Throws whittle::Error
/// (usage) for another name, or for a CUDA device when LibTorch sees none or fewer than N + 1.
at::Device open_device(const std::string& name);

/// Classification metrics over a dataset.
struct EvalMetrics {
  double top1 = 0;     ///< fraction correct, in [0, 1]
  double top5 = 0;     ///< fraction with the label among the 5 highest logits (all when < 5 classes)
  double loss = 0;     ///< mean cross-entropy
  int64_t samples = 0;
};

/// What a run produced.
struct RunResult {
  EvalMetrics test;                  ///< after the last completed epoch
  bool interrupted = false;          ///< stopped by SIGINT (state saved; resume with --resume)
  int64_t epochs_done = 0;
  std::string run_dir;
  std::string checkpoint;            ///< path of the checkpoint
  int64_t checkpoint_bytes = 0;
  int64_t params = 0;
  int64_t macs = 0;                  ///< per image
  double wall_seconds = 0;
  double train_images_per_second = 0;
};

/// Runs a recipe to completion (or to SIGINT, after which the training state is saved and the
/// run can continue with RunOptions::resume). Throws whittle::Error for unloadable data or models,
/// an unwritable run directory (checked before training starts), or a missing/incompatible
/// training state on resume.
RunResult run_recipe(const Recipe& recipe, const RunOptions& options);

/// Evaluates `model` (switched to eval mode, no gradients) on every batch of `loader` on `device`.
EvalMetrics evaluate(GraphModule& model, data::DataLoader& loader, const at::Device& device);

/// The learning rate of `schedule` for base rate `lr` at `epoch_position` (fractional epochs since
/// the start) of `total_epochs`: constant, step (lr·γ^⌊e/step_size⌋), multistep, cosine (from lr to
/// min_lr over the run), one_cycle (cosine rise to max_lr over pct_start of the run, then cosine
/// fall to max_lr/1e4, as torch.optim.lr_scheduler.OneCycleLR with anneal cos); with warmup_epochs
/// > 0 the rate is additionally scaled by epoch_position / warmup_epochs until then.
double learning_rate_at(const ScheduleSpec& schedule, double lr, double epoch_position, double total_epochs);

/// Asks a running run_recipe to stop after the current batch and save its state (async-signal-safe).
void request_stop() noexcept;
/// Installs a SIGINT handler that calls request_stop() (a second SIGINT kills the process).
void install_sigint_handler();

}  // namespace whittle::runner
