#pragma once
// Recipes: the YAML files `whittle run` executes. A recipe names the model, the data, the training
// schedule, the compression modifiers with their epoch windows, and the outputs. Every key is
// validated against a schema before any work starts (unknown keys name the closest valid key and
// the line; wrong types and missing files name the key and what was expected). docs/recipes.md
// documents every key.

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/options.h"
#include "graph/graph.h"

namespace whittle::runner {

// The options machinery lives in core/ (core/options.h); these names are also the recipe's.
using whittle::key_type_name;
using whittle::KeySpec;
using whittle::KeyType;
using whittle::Range;
using whittle::Settings;
using whittle::SettingValue;

/// `model:` — what to train.
struct ModelSpec {
  std::string name;          ///< zoo model name ("lenet5", "resnet20", ...), or
  std::string file;          ///< a TorchScript .pt or a whittle checkpoint .h5 (resolved against the recipe's folder)
  /// Classifier outputs of a zoo model. Beside `file`: the outputs the file's model must have
  /// (checked when it is loaded); parse_recipe sets 0 (not checked) when the recipe does not say,
  /// and a Recipe built in code with a `file` should set 0 or the file's classifier width.
  int64_t num_classes = 10;
  std::string weight_init = "torch";  ///< a zoo model's conv initialization: "torch" or "kaiming_normal" (zoo.h, WeightInit)
  Shape input_shape;         ///< example input [N, C, H, W]; empty: the dataset's image shape with N = 1
};

/// `data:` — datasets, preprocessing and loading.
struct DataSpec {
  std::string train;               ///< training set: MNIST IDX folder/file, CIFAR-10 binary folder, image folder or .h5
  std::string test;                ///< evaluation set (same kinds)
  std::string train_split = "train";  ///< MNIST/CIFAR split name of `train` when it is a folder holding both
  std::string test_split = "test";    ///< split name of `test`
  std::string pack_to;             ///< image folders: pack to this HDF5 directory on first use ("" = no packing)
  std::vector<double> mean;        ///< per-channel normalization mean, in [0, 1] pixel units (empty: none)
  std::vector<double> std;         ///< per-channel normalization std
  int64_t random_crop_padding = 0; ///< training: zero-pad by this many pixels, then crop back at a random offset (0 = off)
  bool horizontal_flip = false;    ///< training: flip left-right with probability 1/2
  int64_t batch_size = 128;
  int64_t eval_batch_size = 500;
  int64_t num_workers = 2;         ///< loader threads
  int64_t prefetch = 4;            ///< batches prepared ahead
  bool drop_last = true;           ///< training: drop the last incomplete batch
  int64_t train_limit = 0;         ///< use only N training images, class-balanced (0 = all); for quick runs
  int64_t test_limit = 0;          ///< use only N test images, class-balanced (0 = all)
};

/// `training.optimizer:`.
struct OptimizerSpec {
  std::string name = "sgd";   ///< sgd | adam | adamw
  double lr = 0.1;
  double momentum = 0.9;      ///< sgd
  bool nesterov = false;      ///< sgd
  double weight_decay = 0.0;  ///< L2 (sgd, adam) or decoupled (adamw)
  /// Weight decay of normalization layers' γ and β (OpTraits::norm_params); unset: weight_decay.
  std::optional<double> norm_weight_decay;
  /// Weight decay of the other parameters named `bias`; unset: weight_decay.
  std::optional<double> bias_weight_decay;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< adam, adamw
  bool fused = false;         ///< sgd: ATen's fused kernel (runner/optimizer.h FusedSGD)
};

/// `training.lr_schedule:`.
struct ScheduleSpec {
  std::string name = "constant";    ///< constant | step | multistep | cosine | linear | one_cycle
  double step_size = 30;            ///< step: epochs between decays
  std::vector<double> milestones;   ///< multistep: epochs at which lr *= gamma
  double gamma = 0.1;               ///< step, multistep
  double min_lr = 0.0;              ///< cosine, linear: final lr
  double max_lr = 0.0;              ///< one_cycle: peak lr (0: training.optimizer.lr)
  double pct_start = 0.3;           ///< one_cycle: fraction of steps spent rising
  double warmup_epochs = 0.0;       ///< linear warmup from 0 to the schedule's lr over this many epochs
};

/// `training:`.
struct TrainingSpec {
  int64_t epochs = 1;
  OptimizerSpec optimizer;
  ScheduleSpec lr_schedule;
  double label_smoothing = 0.0;
  int64_t grad_accumulation = 1;  ///< optimizer step every N batches
  double grad_clip_norm = 0.0;    ///< clip the global gradient norm (0 = off)
  int64_t seed = 0;
  bool deterministic = false;     ///< ATen deterministic algorithms, cuDNN deterministic (docs/reproducibility.md)
  std::string device = "cpu";     ///< cpu | cuda | cuda:N
  std::string amp = "none";       ///< none | bf16 | fp16 (CUDA autocast; fp16 uses loss scaling)
  bool channels_last = false;     ///< CUDA: NHWC memory format
  bool cudnn_benchmark = true;    ///< CUDA: cuDNN autotuning (off in deterministic mode)
  int64_t threads = 0;            ///< intra-op CPU threads (0: LibTorch's default)
  int64_t log_every = 50;         ///< batches between plain progress lines (non-terminal output)
  /// Node-name prefixes of the segments recomputed in the backward instead of keeping their
  /// activations (GraphModule::set_checkpoint_segments), e.g. [layer1, layer2, layer3].
  std::vector<std::string> activation_checkpointing;
};

/// `distributed:` — data-parallel training across processes (runner/distributed.h,
/// docs/distributed.md). It applies when the launcher sets WORLD_SIZE (torchrun, SLURM scripts);
/// a single process ignores it.
struct DistributedSpec {
  std::string backend = "auto";         ///< auto (nccl on CUDA, gloo on CPU) | gloo | nccl
  double timeout_seconds = 1800;        ///< a collective waiting longer than this fails (a peer hung or died)
  double bucket_cap_mb = 25;            ///< gradient bucket size, MiB (as DDP's bucket_cap_mb)
  bool find_unused_parameters = false;  ///< allow parameters that get no gradient in a step
  bool broadcast_buffers = true;        ///< rank 0's buffers (BN running statistics) to every rank before each forward
  bool sync_batchnorm = false;          ///< batch norms use the statistics of the global batch (SyncBatchNorm)
  int64_t verify_every = 0;             ///< every N optimizer steps check the ranks' parameters are bitwise equal (0 = off)
};

/// A modifier entry's own settings (every key but the common name, start_epoch, end_epoch,
/// targets and ignore): only the keys the recipe gives (core/options.h).
using ModifierSettings = Settings;

/// One entry of `modifiers:`.
struct ModifierSpec {
  std::string name;                  ///< registered modifier name
  double start_epoch = 0.0;          ///< first epoch (fractional) the modifier is active
  double end_epoch = -1.0;           ///< epoch it stops (-1 = to the end)
  std::vector<std::string> targets;  ///< node names, op kinds, or "re:<regex>" (empty: the modifier's default)
  std::vector<std::string> ignore;   ///< same forms, excluded from targets
  ModifierSettings settings;         ///< the entry's own settings, typed by the modifier's schema
  int line = 0;                      ///< 1-based line of the entry in the recipe
  std::string location = "recipe";   ///< "file:line" of the entry for messages, "(with --set)" when overridden
};

/// `outputs:`.
struct OutputsSpec {
  std::string dir;                   ///< run directory (default: runs/<recipe file stem>)
  std::string checkpoint = "model.h5";
  bool save_every_epoch = true;      ///< write the checkpoint and training state after every epoch
  /// Formats the final model is also exported in, beside the checkpoint (registered exporters,
  /// export/exporter.h): "onnx" (<stem>.onnx), "torchscript" (<stem>.pt), <stem> the checkpoint's
  /// name without its extension.
  std::vector<std::string> export_formats;
  /// Each format's options as the recipe gives them (outputs.<format>_<option>, e.g. onnx_opset).
  std::map<std::string, Settings> export_options;
};

/// The file name outputs.export writes for `format`: <stem> (outputs.checkpoint without its
/// extension) and the exporter's first extension ("onnx" → <stem>.onnx, "torchscript" → <stem>.pt).
std::string export_file_name(const OutputsSpec& outputs, const std::string& format);

/// A validated recipe.
struct Recipe {
  std::string path;      ///< file it came from
  std::string base_dir;  ///< folder paths in it are relative to (the project root when it lives under recipes/)
  std::string text;      ///< the effective YAML (after --set overrides), stored in run dirs and checkpoints
  ModelSpec model;
  DataSpec data;
  TrainingSpec training;
  std::vector<ModifierSpec> modifiers;
  OutputsSpec outputs;
  DistributedSpec distributed;
  std::vector<std::string> overrides;  ///< the --set strings it was read with ("training.epochs=0")
};

/// Whether --set gave `key` (a dotted path, "training.epochs") a value in `recipe`, itself or as part
/// of a section holding it ("training={epochs: 0}").
bool overridden(const Recipe& recipe, const std::string& key);

/// The schema of the recipe's sections (model, data, training, modifiers, outputs, distributed).
const std::vector<KeySpec>& recipe_schema();

/// Reads, overrides and validates a recipe. `overrides` are "path.to.key=value" strings (values
/// parsed as YAML scalars or flow sequences; list entries addressed by index, "modifiers.0.weight_bits=4").
/// Throws whittle::Error (usage kind) naming the file, line, key and what was expected: an
/// unknown key (with the closest valid key), a wrong type, a missing required key, an unknown
/// modifier (listing the known ones), a path that does not exist.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});

/// Parses recipe text (as load_recipe, with `origin` naming it in messages and `base_dir` for
/// relative paths).
Recipe parse_recipe(const std::string& text, const std::string& origin, const std::string& base_dir,
                    const std::vector<std::string>& overrides = {});

/// The `data:` section of recipe text `text` (for instance the recipe stored in a checkpoint),
/// type-checked against the schema but without the checks that need the run's files (paths need
/// not exist). Sections other than `data` are not read. Throws whittle::Error (usage) naming
/// `origin` and the line for text that is not valid YAML or a `data` key of the wrong type.
DataSpec parse_recipe_data(const std::string& text, const std::string& origin);

/// The `modifiers:` section of recipe text `text` (for instance a run directory's recipe.yaml),
/// each entry checked as parse_recipe checks it (its keys against its modifier's, its window
/// inside training.epochs when the text gives them) but without the checks that need the run's
/// files. Throws whittle::Error (usage) naming `origin` and the line.
std::vector<ModifierSpec> parse_recipe_modifiers(const std::string& text, const std::string& origin);

/// The closest of `candidates` to `word` by edit distance ("" when none is close).
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

/// True for the device names whittle accepts: "cpu", "cuda" and "cuda:N" (N a decimal index).
bool is_device_name(const std::string& device);


}  // namespace whittle::runner
