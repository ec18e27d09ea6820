#pragma once
// The recipe modifiers `prune` (channel pruning on a schedule: one-shot, iterative, AGP; see
// prune/prune.h and docs/pruning.md) and `bn_sparsity` (network slimming's L1 penalty on BN γ).

#include <cstdint>
#include <optional>
#include <string>

#include "prune/prune.h"
#include "runner/modifier_options.h"

namespace whittle::runner {

/// Settings of the `prune` modifier.
struct PruneModifierOptions {
  std::string criterion = "l1";        ///< l1 | l2 | bn_scale | fpgm | taylor | random
  std::string group_reduction = "sum";  ///< how members' scores combine: sum | mean
  double sparsity = 0.5;               ///< final fraction of each group's channels removed (no target given)
  std::optional<double> target_macs;   ///< final MACs kept, a fraction of the unpruned model's
  std::optional<double> target_params;  ///< final parameters kept, a fraction
  bool global = false;                 ///< one ranking over all groups
  int64_t round_to = 1;                ///< kept channels a multiple of this
  int64_t min_channels = 1;            ///< no group keeps fewer
  std::string schedule = "one_shot";   ///< one_shot | iterative | agp
  double update_frequency = 1.0;       ///< iterative/agp: epochs between pruning steps
  double initial_sparsity = 0.0;       ///< agp: s_i of s_t = s_f + (s_i − s_f)(1 − (t − t0)/(nΔt))³
  bool fold_constant_outputs = true;   ///< fold removed channels' constants into the next biases
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
