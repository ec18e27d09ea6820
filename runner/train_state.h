#pragma once
// The resumable training state of a run directory (`<dir>/train_state.pt`, a LibTorch archive),
// written at every epoch end and on Ctrl-C, read by `whittle run --resume`. It holds everything a
// resumed run needs to continue exactly as the uninterrupted one would:
//
//   format       int64: kTrainStateFormat
//   recipe       string: the effective recipe text of the run (a resume must run the same text)
//   epoch, batch, step, seen, correct   int64: the TrainerState; loss_sum float64
//   train_seconds  float64: the TrainerState's seconds of the epoch's training pass so far (absent
//                in states of earlier whittles: read as −1, unknown)
//   graph        string: graph_to_json of the model as it is at the save (after every change the
//                modifiers made: quantizers, QAT-folded layers, removed channels)
//   tensors      archive: every parameter and buffer under its state_dict name, on the CPU
//   frozen       string: JSON list of the parameters that do not require gradients
//   modifiers    string: JSON list of {"name", "state"} (Modifier::state), in recipe order
//   modifier_tensors  archive: each modifier's state_tensors() as "<index>.<name>" (CPU); absent
//                when no modifier has any
//   optimizer    archive: torch::optim::Optimizer::save
//   loss_scale, loss_scale_clean_steps   float64, int64: the fp16 LossScaler
//   cpu_rng      uint8: LibTorch's default CPU generator state

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/graph_module.h"

namespace whittle::runner {

class LossScaler;
class Modifier;

/// The training state format this whittle writes and reads. Format 2 added the recipe text, the
/// graph structure the tensors belong to, the modifiers' states, the epoch's running training
/// metrics and the loss scaler; format 1 states are refused with a clear error.
constexpr int64_t kTrainStateFormat = 2;

/// Where a run stands.
struct TrainerState {
  int64_t epoch = 0;    ///< epoch being trained, 0-based (== epochs: training is over)
  int64_t batch = 0;    ///< next batch of `epoch` to train (== batches per epoch: the epoch's
                        ///< batches are done, its end hooks and evaluation are not)
  int64_t step = 0;     ///< optimizer steps done
  double loss_sum = 0;  ///< sum of the training loss over the samples of `epoch` trained so far
  int64_t correct = 0;  ///< samples of `epoch` trained so far that were classified correctly
  int64_t seen = 0;     ///< samples of `epoch` trained so far
  double train_seconds = 0;  ///< wall seconds of `epoch`'s training pass so far, over every sitting (−1: unknown)
  int64_t world_size = 1;    ///< data-parallel ranks that trained it (`batch` counts each rank's batches)
};

/// Writes the training state (layout above) to `path` atomically (a temporary file, then rename).
/// Throws whittle::Error naming the path when it cannot be written.
void save_train_state(const std::string& path, const std::string& recipe_text, const TrainerState& state,
                      GraphModule& model, const std::vector<std::unique_ptr<Modifier>>& modifiers,
                      const torch::optim::Optimizer& optimizer, const LossScaler& scaler);

/// A training state read back. A resume takes the graph (take_graph), restores the modifiers'
/// states before their on_start, builds the optimizer over the restored model, then restores the
/// optimizer, the loss scaler and, last, the CPU generator.
class SavedTrainState {
 public:
  /// Reads `path`. Throws whittle::Error naming the path when it is missing ("nothing to resume"),
  /// unreadable or damaged, of another format (an older whittle's), or when its recipe differs
  /// from `recipe_text` (the run would not continue the same training). Recipes are compared as
  /// parsed YAML: comments and spacing may differ.
  static SavedTrainState read(const std::string& path, const std::string& recipe_text);

  const TrainerState& state() const { return state_; }
  /// The model graph as it was at the save, with its tensors (CPU), rebuilt once (later calls
  /// throw). Parameters that did not require gradients at the save do not now.
  Graph take_graph();
  /// Names of the parameters that did not require gradients at the save.
  const std::vector<std::string>& frozen_parameters() const { return frozen_; }
  /// Calls load_state on each modifier with its saved state. Throws whittle::Error when the saved
  /// modifiers (count and names) are not these.
  void restore_modifiers(const std::vector<std::unique_ptr<Modifier>>& modifiers) const;
  /// Copies each modifier's saved state_tensors() into its current ones (call after on_start, which
  /// creates them, and before building the optimizer). Throws whittle::Error naming the tensor when
  /// one is missing or of another shape.
  void restore_modifier_tensors(const std::vector<std::unique_ptr<Modifier>>& modifiers);
  /// Loads the saved optimizer state into `optimizer`, which must have been built over the restored
  /// model's parameters in the same order. Throws whittle::Error when it does not fit.
  void restore_optimizer(torch::optim::Optimizer& optimizer);
  void restore_loss_scaler(LossScaler& scaler) const;
  /// Sets LibTorch's default CPU generator to its state at the save.
  void restore_rng();

 private:
  std::string path_;
  TrainerState state_;
  std::string graph_json_;
  bool graph_taken_ = false;
  std::vector<std::string> frozen_;
  std::vector<std::pair<std::string, std::string>> modifiers_;  // name, state
  double loss_scale_ = 0;
  int64_t loss_scale_clean_steps_ = 0;
  torch::serialize::InputArchive archive_;
};

}  // namespace whittle::runner
