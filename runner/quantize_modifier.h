#pragma once
// The recipe modifier `quantize` (quantization-aware training; see quantize/quantize.h and
// docs/quantization.md).

#include <cstdint>
#include <optional>
#include <string>

#include "quantize/quantize.h"
#include "runner/modifier_options.h"

namespace whittle::runner {

/// Settings of the `quantize` modifier. Fields that quantize::Config also has take Config's
/// defaults; an unset optional takes the method's default (quantize::resolve).
struct QuantizeModifierOptions {
  std::string method = quantize::Config{}.method;            ///< dorefa | twn | bnn | xnor
  std::optional<int64_t> weight_bits;                        ///< unset: dorefa 8, twn 2, bnn/xnor 1
  std::optional<int64_t> activation_bits;                    ///< unset: dorefa 8, twn 32, bnn/xnor 1
  double activation_clip = quantize::Config{}.activation_clip;  ///< DoReFa activation clip level c
  std::optional<std::string> granularity;                    ///< per_tensor | per_channel; unset: the method's
  bool xnor_detach_alpha = quantize::Config{}.xnor_detach_alpha;
  bool xnor_scale_k = quantize::Config{}.xnor_scale_k;
  bool clip_latent_weights = true;  ///< bnn: clip the latent weights to [−1, 1] after each optimizer step
};

/// The recipe keys of QuantizeModifierOptions (the modifier's settings schema).
const OptionsSchema<QuantizeModifierOptions>& quantize_modifier_schema();

/// Registers the `quantize` modifier with register_modifier (called by register_builtin_modifiers).
/// Its state (Modifier::state) is {"applied": bool}: whether the quantizers are attached.
void register_quantize_modifier();

}  // namespace whittle::runner
