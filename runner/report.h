#pragma once
// The final report of a run: `<dir>/report.json` and the table `whittle run` prints at the end.

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
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
  /// --resume of a run that had finished: nothing was trained or written; `test`, `epochs_done`
  /// and `checkpoint_bytes` are its report.json's.
  bool finished_before = false;
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
  /// Data-parallel runs (runner/distributed.h): processes, their c10d backend, and the images of
  /// one optimizer step over all of them (data.batch_size · grad_accumulation · world_size).
  int64_t world_size = 1;
  std::string distributed_backend;
  int64_t global_batch_size = 0;
};

/// One node's costs and storage, as `whittle inspect` and report.json show them.
struct LayerSummary {
  std::string name;
  std::string op;
  Shape output_shape;
  int64_t params = 0;
  int64_t macs = 0;         ///< per image
  int64_t weight_bits = 0;  ///< stored bits per weight: the quantizer's weight_bits, else the dtype's (0: no weight)
  /// What quantizes the node, with its learned values: "lsq, weight_step 0.0081 to 0.0452" (a weight
  /// quantizer and its parameters' range), "lsq A4 on [0, 1.853]" (an activation quantizer, its bits
  /// and the range its grid covers), "sign ±1"; empty when nothing does.
  std::string quantizer;
  int64_t channels = -1;    ///< output channels of a pruned node (−1: the node was not pruned)
  int64_t unpruned_channels = -1;
  int64_t unpruned_params = -1;  ///< the node's parameters and MACs before pruning (−1: unchanged or not recorded)
  int64_t unpruned_macs = -1;
};

/// Per-node and total costs and sizes of a graph (per image: the graph's declared batch size is
/// divided out by node_cost).
struct ModelSummary {
  std::vector<LayerSummary> layers;  ///< in graph order
  int64_t params = 0;
  int64_t macs = 0;
  double bytes = 0;              ///< tensors at stored precision: weights at weight_bits, the rest at their dtype
  double fp32_bytes = 0;         ///< the same tensors as float32 (a packed weight counted as its float32 shape)
  double theoretical_bytes = 0;  ///< weight_bits per quantized weight, 32 bits per other value
  bool pruned = false;           ///< some node records pre-pruning channels or costs
  int64_t unpruned_params = -1;  ///< totals before pruning (−1: not recorded, e.g. pruned by an older whittle)
  int64_t unpruned_macs = -1;
};

/// Summarizes `graph` node by node (weight bits, channels kept, parameters, MACs, bytes).
ModelSummary summarize_model(const Graph& graph);

/// `summary` as JSON text: {"nodes": [{name, op, output_shape, params, macs, weight_bits,
/// [channels, unpruned_channels], [unpruned_params, unpruned_macs]}, ...], "total": {params, macs,
/// bytes, fp32_bytes, theoretical_bytes, [unpruned_params, unpruned_macs]}} (the `model_summary` of
/// report.json, the body of `whittle inspect --json`).
std::string model_summary_json(const ModelSummary& summary);

/// Writes `path` (report.json, atomically): recipe, model, test metrics, epochs, parameters,
/// MACs per image, checkpoint path and bytes, wall time, training images/s, the last epoch's
/// loss_terms (when any), the exported files (when any), `device`, and what
/// float results depend on (ATen CPU capability, intra-op threads, seed, deterministic, LibTorch
/// version; docs/reproducibility.md), and `model_summary` of the final `model`
/// (model_summary_json). Throws whittle::Error when it cannot be written.
void write_report(const std::string& path, const Recipe& recipe, const RunResult& result, const std::string& device,
                  const Graph& model);

/// Prints the end-of-run table (test top-1/top-5 in %, loss, parameters, MACs, checkpoint, wall
/// time in s, training speed, report path) to `os`.
void print_report(std::ostream& os, const Recipe& recipe, const RunResult& result, const std::string& report_path);

}  // namespace whittle::runner
