#pragma once
// The final report of a run: `<dir>/report.json` and the table `whittle run` prints at the end.

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>

#include "runner/recipe.h"

namespace whittle::runner {

/// Classification metrics over a dataset.
struct EvalMetrics {
  double top1 = 0;  ///< fraction correct, in [0, 1]
  double top5 = 0;  ///< fraction with the label among the 5 highest logits (all when < 5 classes)
  double loss = 0;  ///< mean cross-entropy
  int64_t samples = 0;
};

/// What a run produced.
struct RunResult {
  EvalMetrics test;          ///< after the last completed epoch
  bool interrupted = false;  ///< stopped by SIGINT (state saved; resume with --resume)
  int64_t epochs_done = 0;
  std::string run_dir;
  std::string checkpoint;  ///< path of the checkpoint
  int64_t checkpoint_bytes = 0;
  int64_t params = 0;
  int64_t macs = 0;  ///< per image
  double wall_seconds = 0;
  double train_images_per_second = 0;
  /// The modifiers' per-epoch figures of the last completed epoch (Modifier::epoch_metrics, e.g.
  /// distillation's hard_loss and kd_loss: means over its batches); empty when none has any.
  std::map<std::string, double> loss_terms;
  /// Files written by outputs.export: format ("onnx", "torchscript") → path, with their sizes.
  std::map<std::string, std::string> exports;
  std::map<std::string, int64_t> export_bytes;
};

/// Writes `path` (report.json, atomically): recipe, model, test metrics, epochs, parameters,
/// MACs per image, checkpoint path and bytes, wall time, training images/s, the last epoch's
/// loss_terms (when any), the exported files (when any), `device`, and what
/// float results depend on (ATen CPU capability, intra-op threads, seed, deterministic, LibTorch
/// version; docs/reproducibility.md). Throws whittle::Error when it cannot be written.
void write_report(const std::string& path, const Recipe& recipe, const RunResult& result, const std::string& device);

/// Prints the end-of-run table (test top-1/top-5 in %, loss, parameters, MACs, checkpoint, wall
/// time in s, training speed, report path) to `os`.
void print_report(std::ostream& os, const Recipe& recipe, const RunResult& result, const std::string& report_path);

}  // namespace whittle::runner
