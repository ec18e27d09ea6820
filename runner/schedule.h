#pragma once
// Learning-rate schedules of `training.lr_schedule` (docs/recipes.md).

#include "runner/recipe.h"

namespace whittle::runner {

/// The learning rate of `schedule` for base rate `lr` at `epoch_position` (fractional epochs since
/// the start) of `total_epochs`: constant, step (lr·γ^⌊e/step_size⌋), multistep, cosine (from lr to
/// min_lr over the run), linear (a straight line from lr to min_lr), one_cycle (cosine rise to max_lr over pct_start of the run, then cosine
/// fall to max_lr/1e4, as torch.optim.lr_scheduler.OneCycleLR with anneal cos); with warmup_epochs
/// > 0 the rate is additionally scaled by epoch_position / warmup_epochs until then. Throws
/// whittle::Error (usage) for an unknown schedule name.
double learning_rate_at(const ScheduleSpec& schedule, double lr, double epoch_position, double total_epochs);

}  // namespace whittle::runner
