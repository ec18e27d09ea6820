#pragma once
// The training and evaluation loop behind `whittle run`: a Trainer builds the model and the data
// from a Recipe, trains with the recipe's optimizer and schedule while calling the modifiers'
// hooks, evaluates every epoch, and keeps a run directory:
//
//   <dir>/recipe.yaml      the effective recipe (after --set)
//   <dir>/model.h5         the checkpoint (export/checkpoint.h), rewritten atomically each epoch
//   <dir>/train_state.pt   resumable training state (runner/train_state.h: recipe, graph as it is
//                          now, tensors, modifiers' states, optimizer, position, RNG state)
//   <dir>/metrics.jsonl    one JSON object per epoch
//   <dir>/report.json      the final report (runner/report.h)
//
// run_recipe(recipe, options) is Trainer(recipe, options).run().

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "graph/graph_module.h"
#include "runner/amp.h"
#include "runner/distributed.h"
#include "runner/modifier.h"
#include "runner/recipe.h"
#include "runner/report.h"
#include "runner/schedule.h"
#include "runner/train_state.h"

namespace whittle::data {
class DataLoader;
struct Batch;
struct Dataset;
}  // namespace whittle::data

namespace whittle::runner {

class ProgressBar;

/// Command-line choices that override the recipe.
struct RunOptions {
  std::string out_dir;          ///< run directory ("" = recipe outputs.dir)
  std::string device;           ///< "" = recipe training.device
  bool resume = false;          ///< continue from <dir>/train_state.pt
  bool overwrite = false;       ///< replace a run already in the directory (else that is an error):
                                ///< its files stay as they are until this run writes its own (its
                                ///< first epoch's end, or a Ctrl-C), then each is replaced
  std::ostream* log = nullptr;  ///< progress and report (nullptr = std::cout)
  /// Data-parallel training over this process group (runner/distributed.h; nullptr = one
  /// process). Every rank trains its shard of each epoch with gradients averaged over the ranks and
  /// evaluates its shard of the test set (the metrics summed); rank 0 alone prints, and writes the
  /// run directory. On resume every rank reads the training state, so the run directory must be
  /// where every rank can read it (one machine, or a shared file system).
  std::shared_ptr<ProcessGroup> group;
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

/// Evaluates `model` (switched to eval mode, no gradients) on every batch of `loader` on `device`:
/// images [N, C, H, W], labels [N] int64, logits [N, classes]. With `group`, each rank's loader
/// holds its shard of the test set and the counts are summed over the ranks (every rank gets the
/// whole set's metrics); throws whittle::Error from the collective.
EvalMetrics evaluate(GraphModule& model, data::DataLoader& loader, const at::Device& device,
                     ProcessGroup* group = nullptr);
/// The same for any model given as its forward function (images → logits; run without gradients),
/// such as deploy::Model's.
EvalMetrics evaluate(const std::function<at::Tensor(const at::Tensor&)>& forward, data::DataLoader& loader,
                     const at::Device& device, ProcessGroup* group = nullptr);

/// The first parameter of `module` (in named_parameters() order, dotted names such as
/// "layer1.0.conv1.weight") whose gradient holds a NaN or an infinity, with how many such values.
struct NonFiniteGradient {
  std::string parameter;
  int64_t count = 0;
};
/// Looks for a non-finite gradient among the parameters of `modules` (undefined gradients are
/// skipped); nullopt when every gradient is finite. One sum over all gradients (one device
/// synchronization) when they are; a search by parameter only when not.
std::optional<NonFiniteGradient> find_non_finite_gradient(const std::vector<GraphModule>& modules);
/// For a user's own training loop, after backward(): throws whittle::Error naming the first
/// parameter with a non-finite gradient ("training step: the gradient of conv1.weight holds 12 NaN
/// or infinite values"), as `whittle run` stops on one. A step with such a gradient would write
/// NaN into the weights.
void require_finite_gradients(const std::vector<GraphModule>& modules);

/// One run of a recipe, step by step. The constructor does everything before the first batch, in
/// this order (which fixes the use of LibTorch's global generator, so that a run is reproducible):
/// the run directory is checked usable (writable or creatable; when it exists, locked and checked
/// for a previous run); the device opened; threads, at::manual_seed(seed) and deterministic mode
/// set; the data loaded and checked (images in both sets, at least one step an epoch, every
/// modifier window opening at a step); the model built (load_model: a zoo model seeded with
/// training.seed, or the recipe's file) or, on resume, rebuilt from the training state's graph and
/// tensors; the modifiers created and their target patterns checked against the model; only then
/// the run directory created and locked; on resume the modifiers' saved states restored; their on_start run; the optimizer
/// built over the model's trainable parameters; on resume the optimizer state, the loss scaler,
/// the position and, last, the CPU generator restored. Errors before the directory is created
/// leave nothing behind; the run's own files (recipe.yaml, metrics.jsonl) are written when it
/// first saves (end of epoch 1, or Ctrl-C), so a run failing before that leaves a directory it
/// created removed again and a previous run (--overwrite) as it was.
///
/// Not copyable; one Trainer at a time per process (request_stop is process-wide).
class Trainer {
 public:
  /// Throws whittle::Error for an unwritable run directory (before any work), one another process
  /// is running in (a DirectoryLock), one holding a previous run without RunOptions::resume or
  /// overwrite (usage), unloadable or empty data, a batch size that leaves no step (usage), a
  /// modifier window opening after the last step or a target pattern matching no node (usage),
  /// unloadable model, a modifier's settings, or, on resume, a missing, damaged or older-format
  /// training state or one saved with another recipe text.
  Trainer(const Recipe& recipe, const RunOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains from state() to the last epoch, train_epoch() then end_epoch() for each, then
  /// on_finish, the final checkpoint, report.json and the printed report. After request_stop()
  /// it saves the training state where training stopped and returns with `interrupted` set.
  /// With training.epochs 0, calibrate() instead of the epochs.
  RunResult run();

  /// A run of 0 epochs (post-training calibration): on_epoch_begin, then one on_step_begin in eval
  /// mode without gradients, the batches it asks for (TrainContext::train_batch) from the training
  /// split with the evaluation transforms; no loss and no optimizer step. Then the evaluation on the
  /// test set and its metrics.jsonl line (epoch 0). Modifiers that need training were refused
  /// when the Trainer was built (Modifier::needs_training).
  EvalMetrics calibrate();

  /// Trains the rest of epoch state().epoch from batch state().batch: on_epoch_begin first when
  /// the epoch starts at batch 0 (not when a resumed run continues inside it), then step() per
  /// batch with a progress line. Returns false when request_stop() stopped it (after the batch in
  /// progress; state() says where), true when the epoch's batches are done.
  bool train_epoch();

  /// Ends the epoch whose batches train_epoch() finished: on_epoch_end, evaluation on the test set,
  /// its metrics.jsonl line and log line, the checkpoint and training state (every epoch with
  /// outputs.save_every_epoch, else after the last); state() moves to the next epoch's batch 0.
  EvalMetrics end_epoch();

  /// One training batch (images [N, C, H, W], labels [N]) as batch state().batch of the epoch:
  /// every modifier's on_step_begin at the batch's fractional epoch (a parameter change rebuilds
  /// the optimizer), the learning rate of the schedule at that epoch, forward (under autocast with
  /// training.amp), cross-entropy with label smoothing, each active modifier's on_loss, backward of
  /// loss / grad_accumulation (scaled for fp16); every grad_accumulation batches (and at the epoch's
  /// last batch) gradient unscaling and clipping, the optimizer step, zero_grad and each active
  /// modifier's on_step_end. When a hook changed the parameter set, the optimizer is rebuilt
  /// (rebuild_optimizer). Updates state(): batch, step and the epoch's running sums. Throws
  /// whittle::Error, before the backward pass, when the loss is not finite (naming the step; the
  /// files on disk stay those of the last finished epoch).
  void step(const data::Batch& batch);

  /// The model on the test set (evaluate()).
  EvalMetrics evaluate();

  /// Writes the training state (runner/train_state.h) to <dir>/train_state.pt (rank 0 of a
  /// data-parallel run; the others write nothing).
  void save_state();

  /// Where the run stands (saved with the training state).
  const TrainerState& state() const { return state_; }
  /// The model being trained (on device()).
  GraphModule& model() { return model_; }
  /// The current optimizer; a parameter change replaces it (rebuild_optimizer), so do not keep
  /// the reference across step() or the epoch hooks.
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  /// What the modifiers' hooks receive.
  TrainContext& context() { return tc_; }
  /// The recipe's modifiers, in recipe order.
  const std::vector<std::unique_ptr<Modifier>>& modifiers() const { return modifiers_; }
  /// The training set's loader (batch(epoch, index) rebuilds any batch).
  data::DataLoader& train_loader() { return *train_loader_; }
  const at::Device& device() const { return device_; }
  const std::string& run_dir() const { return result_.run_dir; }
  /// The data-parallel wrapper (nullptr in a single process).
  DistributedDataParallel* data_parallel() { return ddp_.get(); }

 private:
  using Clock = std::chrono::steady_clock;
  void apply_parameter_changes();
  std::vector<GraphModule> parameter_modules();  // the model, then the modifiers' (Modifier::parameter_modules)
  std::vector<at::Tensor> optimized_parameters();  // the model's trainable parameters, then the modifiers' (Modifier::parameters)
  RunResult finish();
  // Writes the outputs.export files of the final model beside the checkpoint (export/).
  void export_final_model();
  std::vector<std::string> run_files() const;  // what a run writes in its directory
  void check_previous_run() const;             // a run already there needs --resume or --overwrite
  void check_modifier_windows() const;         // every window opens at a step of the run
  void check_modifier_targets() const;         // every pattern matches a node; no layer claimed twice
  Settings export_options(const std::string& format) const;  // outputs.<format>_<option> values
  void check_export_forms() const;             // outputs.export: a dry run of each export
  void check_input_shapes() const;             // both data sets' images fit the model's input
  void sum_epoch_over_ranks();                 // state_'s running sums of this rank → the sums over all ranks (rank 0)
  // The constructor's steps, in order. Nothing is written before create_run_directory(): every
  // check that can fail comes first.
  void open_run_directory();   // its paths; a directory already there: locked, checked for a previous run
  void set_up_device();        // device, intra-op threads, seed, determinism
  void make_loaders();         // the data sets and their loaders, checked against the recipe
  std::unique_ptr<SavedTrainState> read_saved_state() const;  // --resume: train_state.pt, else null
  void build_model_and_modifiers(SavedTrainState* saved);  // and their checks against each other
  void create_run_directory();  // a Ctrl-C so far stops here; else the directory is made and locked
  void start_training(SavedTrainState* saved);  // modifiers' start, the optimizer, mixed precision
  void restore_position(SavedTrainState& saved);  // --resume: optimizer, scaler, epoch and batch, RNG
  void set_up_data_parallel();  // DistributedDataParallel over the model's and modifiers' tensors
  void log_start();             // the model, data, device and optimizer line(s); the progress bar

  Recipe recipe_;
  RunOptions options_;
  // The run directory's lock, held for the Trainer's lifetime; a directory this Trainer created
  // and never wrote a file into is removed again when it goes (also when the constructor throws).
  struct RunDirectory {
    std::string path;
    std::unique_ptr<DirectoryLock> lock;
    bool created = false;  // this Trainer made the directory
    bool written = false;  // recipe.yaml and metrics.jsonl written (start_writing)
    ~RunDirectory();
  } run_dir_;
  void start_writing();           // writes them, at the first save or metrics line
  // Writes metrics.jsonl as the lines of the epochs before `epoch` (1-based) and then `line`.
  void write_metrics_line(int64_t epoch, const std::string& line) const;
  bool tested_ = false;  // an epoch ended (and was evaluated) in this sitting
  std::ostream* log_;
  std::ostream null_log_{nullptr};   // ranks other than 0 print nothing
  std::shared_ptr<ProcessGroup> group_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  bool writer_ = true;               // this process prints and writes the run directory (rank 0)
  bool stop_agreed_ = false;         // some rank was asked to stop (agreed in step())
  Clock::time_point t_start_;
  Clock::time_point t_epoch_;
  std::string state_path_;
  at::Device device_ = at::kCPU;
  std::unique_ptr<data::DataLoader> train_loader_;
  std::unique_ptr<data::DataLoader> test_loader_;
  GraphModule model_{nullptr};
  std::vector<std::unique_ptr<Modifier>> modifiers_;
  TrainContext tc_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LossScaler scaler_;
  bool autocast_ = false;
  std::unique_ptr<ProgressBar> progress_;
  TrainerState state_;
  RunResult result_;
  int64_t images_trained_ = 0;  ///< images trained by this process (not before a resume)
  int64_t epoch_images_ = 0;    ///< of them, in the current epoch
  double train_seconds_ = 0;        ///< training passes of this process, s
  double epoch_train_seconds_ = 0;  ///< the current epoch's training pass in this process, s
};

/// Runs a recipe to completion (or to SIGINT, after which the training state is saved and the
/// run can continue with RunOptions::resume): Trainer(recipe, options).run(). Throws whittle::Error
/// as Trainer's constructor does, or for a failure while training.
RunResult run_recipe(const Recipe& recipe, const RunOptions& options);

/// Thrown by the Trainer's constructor when request_stop() came before training started (Ctrl-C
/// while loading): nothing was written. `whittle run` exits 130.
class Interrupted : public Error {
 public:
  using Error::Error;
};

/// Asks a running Trainer to stop after the current batch and save its state (async-signal-safe).
void request_stop() noexcept;
/// Installs SIGINT and SIGTERM handlers that call request_stop(): the run stops after the batch in
/// progress and saves its state (every rank of a data-parallel run stops at the same step). A second
/// SIGINT kills the process; a second SIGTERM is ignored (torchrun sends SIGTERM to the workers of
/// a job whose terminal got Ctrl-C, and SIGKILL after its grace period).
void install_sigint_handler();

}  // namespace whittle::runner
