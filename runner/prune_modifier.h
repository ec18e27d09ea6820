#pragma once
// The recipe modifiers `prune` (channel pruning on a schedule: one-shot, iterative, AGP; see
// prune/prune.h and docs/pruning.md) and `bn_sparsity` (network slimming's L1 penalty on BN γ).

#include <cstdint>
#include <optional>
#include <string>

#include "prune/prune.h"
#include "runner/modifier_options.h"

namespace whittle::runner {

/// Settings of the `prune` modifier: one-shot pruning's options (prune::PruneOptions, less its
/// targets and ignore, which every modifier has) and the schedule that reaches them.
struct PruneModifierOptions : prune::PruneOptions {
  std::string schedule = "one_shot";   ///< one_shot | iterative | agp
  double update_frequency = 1.0;       ///< iterative/agp: epochs between pruning steps
  double initial_sparsity = 0.0;       ///< agp: s_i of s_t = s_f + (s_i − s_f)(1 − (t − t0)/(nΔt))³
};

/// The recipe keys of PruneModifierOptions.
const OptionsSchema<PruneModifierOptions>& prune_modifier_schema();

/// The pruning fraction reached after step `step` of `steps` (1-based) of a schedule: one_shot
/// and the last step give `final`; iterative gives final·step/steps; agp gives
/// final + (initial − final)·(1 − step/steps)³ (Zhu & Gupta 2017).
double scheduled_fraction(const std::string& schedule, int64_t step, int64_t steps, double initial, double final);

/// Settings of the `bn_sparsity` modifier.
struct BnSparsityOptions {
  double penalty = 1e-4;  ///< s of the loss term s·Σ|γ| over the targeted BN layers (gradient s·sign(γ))
};
const OptionsSchema<BnSparsityOptions>& bn_sparsity_schema();

/// Registers `prune` and `bn_sparsity` (called by register_builtin_modifiers). The prune
/// modifier's state is {"steps_done": n, "base_macs": m, "base_params": p, "original_channels":
/// {layer: C₀}}: the unpruned model's cost and widths, which every step is measured against.
void register_prune_modifiers();

}  // namespace whittle::runner
