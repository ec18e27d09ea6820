#pragma once
// The files of a run directory (docs/recipes.md, "The run directory"), named in one place: the
// trainer writes them, `whittle run --resume` and `whittle report` read them, and the recipe
// parser keeps outputs.checkpoint and the export files off their names.

#include <string>
#include <vector>

namespace whittle::runner::run_files {

/// The training state a run resumes from (model, optimizer, modifiers, RNG, position): a
/// TorchScript-style zip archive, rewritten at each save.
inline constexpr const char* kTrainState = "train_state.pt";
/// One JSON line per finished epoch (loss, top-1, learning rate, timings).
inline constexpr const char* kMetrics = "metrics.jsonl";
/// The finished run's summary (written last: its presence means the run is done).
inline constexpr const char* kReport = "report.json";
/// The recipe text the run was started with (a resume must give the same).
inline constexpr const char* kRecipe = "recipe.yaml";
/// The lock file of core/file_util.h's DirectoryLock, held while a run writes the directory.
inline constexpr const char* kLock = ".whittle.lock";

/// The names above: files of the run itself, which outputs.checkpoint and exports may not take.
inline std::vector<std::string> reserved() { return {kTrainState, kMetrics, kReport, kRecipe, kLock}; }

}  // namespace whittle::runner::run_files
