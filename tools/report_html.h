#pragma once
// The runs `whittle report` compares, and its self-contained HTML page (inline SVG charts, no
// script, no network): training curves, accuracy against checkpoint size with the Pareto front,
// and per run a layer table.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runner/report.h"

namespace whittle::cli {

/// One epoch of a run's metrics.jsonl. Fractions in [0, 1]; seconds −1 where the line lacks them.
struct EpochPoint {
  int64_t epoch = 0;  ///< 1-based
  double train_loss = 0;
  double train_top1 = 0;
  double test_loss = 0;
  double test_top1 = 0;
  double test_top5 = 0;
  double seconds = -1;  ///< the epoch's training pass plus evaluation, s
  double images_per_second = 0;  ///< the line's train_images_per_second (earlier whittles: evaluation included)
};

/// A finished run directory, as `whittle report` reads it (report.json, metrics.jsonl,
/// recipe.yaml, and the checkpoint when report.json has no model summary).
struct RunSummary {
  std::string dir;     ///< as given on the command line
  std::string label;   ///< short name (assign_labels): the shortest path suffix no other run shares
  std::string model;   ///< zoo name or model file
  std::string method;  ///< "FP32", "DoReFa W2A2", "BNN + KD", "pruned L1 (50 % MACs) + DoReFa W4A4", ...
  std::string tool = "whittle";  ///< report.json's `tool`: another toolkit's run in whittle's format (bench/)
  double test_top1 = 0;  ///< fraction
  double test_top5 = 0;
  double test_loss = 0;
  int64_t test_images = 0;
  int64_t epochs = 0;
  int64_t params = 0;
  int64_t macs = 0;  ///< per image
  int64_t checkpoint_bytes = 0;
  /// Training time over every sitting: the sum of the epochs' seconds (metrics.jsonl); report.json's
  /// wall_seconds (the last sitting only) when the lines lack them; a run of 0 epochs' calibration_seconds.
  double training_seconds = 0;
  bool training_seconds_from_wall = false;
  bool calibration_only = false;  ///< a run of 0 epochs: metrics.jsonl's one line is its calibration's
  std::vector<EpochPoint> curve;
  std::optional<runner::ModelSummary> layers;  ///< absent when neither report.json nor a checkpoint has it
  std::string device, cpu_capability, torch_version;
  int64_t intra_op_threads = 0;
};

/// Reads run directory `dir`. Throws whittle::Error naming the file (and line) when report.json
/// is missing or not a run report, or metrics.jsonl or recipe.yaml is malformed. An epoch with
/// several metrics lines (repeated after a kill) counts once, by its last line. Without a
/// model_summary in report.json, the layers come from the whittle checkpoint (.h5) beside it;
/// one that does not load is reported on stderr and leaves `layers` empty.
RunSummary read_run(const std::string& dir);

/// Labels each run by the fewest trailing components of its directory that no other run shares
/// ("resnet20_budget", or "lenet5_bnn/s0_t1" beside "lenet5_xnor/s0_t1").
void assign_labels(std::vector<RunSummary>& runs);

/// The HTML page of `runs` (labelled) (at least one), titled `title`: a summary table, test top-1 per epoch of
/// every run, accuracy against checkpoint bytes (log scale) with the Pareto front (no other run is
/// at most as large and at least as accurate, and better in one) joined and marked, and per run its curves (loss, top-1; train and
/// test) and layer table (bits, channels kept, parameters, MACs).
std::string render_report_html(const std::vector<RunSummary>& runs, const std::string& title);

/// Indices into `runs` of the Pareto front of (checkpoint bytes, test top-1): the runs no other run
/// beats on one without losing on the other, in increasing size.
std::vector<size_t> pareto_front(const std::vector<RunSummary>& runs);

}  // namespace whittle::cli
