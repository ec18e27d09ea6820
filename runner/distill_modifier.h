#pragma once
// The recipe modifier `distill`: knowledge distillation from a frozen teacher (distill/distill.h,
// docs/distillation.md) while the student trains, alone or with quantize and prune.

#include <string>
#include <vector>

#include "runner/modifier_options.h"

namespace whittle::runner {

/// Settings of the `distill` modifier.
struct DistillModifierOptions {
  std::string teacher;                       ///< the teacher: a whittle checkpoint or a TorchScript file (required)
  std::vector<std::string> method{"kd"};     ///< any of kd, attention, hint
  double temperature = 4.0;                  ///< kd: T
  double alpha = 0.9;                        ///< kd: loss = α·KD + (1 − α)·(the hard-label loss)
  double beta = 2.0;                         ///< attention: β of β/2·‖Q̂_s − Q̂_t‖₂ per pair
  double hint_weight = 1.0;                  ///< hint: weight of the MSE between adapter(student) and teacher, per pair
  std::vector<std::string> pairs;            ///< attention, hint: "student_value:teacher_value" feature pairs
  /// A teacher checkpoint records its recipe: one trained on inputs normalized otherwise (data.mean,
  /// data.std) is refused unless this is set (its soft targets would be for other inputs).
  bool accept_other_normalization = false;
};

/// The recipe keys of DistillModifierOptions.
const OptionsSchema<DistillModifierOptions>& distill_modifier_schema();

/// Registers `distill` (called by register_builtin_modifiers). Its state holds the running sums
/// of the epoch's loss terms, so a resumed run's metrics line is the uninterrupted one's; with
/// `hint`, each pair's adapter (1×1 conv + BN, distill::hint_adapter) is trained with the student
/// (Modifier::parameters) and kept in the training state (Modifier::state_tensors), never in the
/// checkpoint.
void register_distill_modifier();

}  // namespace whittle::runner
