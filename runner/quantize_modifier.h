#pragma once
// The recipe modifier `quantize` (quantization-aware training; see quantize/quantize.h and
// docs/quantization.md). Its keys are the ones every method shares (method, weight_bits,
// activation_bits) and the methods' own, from the method registry (quantize/method.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quantize/quantize.h"
#include "runner/modifier_options.h"

namespace whittle::runner {

/// The settings of the `quantize` modifier every method has. An unset optional takes the method's
/// default (quantize::resolve); the method's own keys go to quantize::Config::options.
struct QuantizeModifierOptions {
  std::string method = quantize::Config{}.method;  ///< a registered method (whittle inspect --methods)
  std::optional<int64_t> weight_bits;              ///< unset: the method's default (dorefa 8, twn 2, bnn/xnor 1)
  std::optional<int64_t> activation_bits;          ///< unset: the method's default (dorefa 8, twn 32, bnn/xnor 1)
};

/// The recipe keys of QuantizeModifierOptions.
const OptionsSchema<QuantizeModifierOptions>& quantize_modifier_schema();

/// Every key of the modifier: quantize_modifier_schema()'s, then each registered method's own
/// keys once, in method order, described with the methods that have them ("dorefa, twn: ...").
std::vector<KeySpec> quantize_modifier_keys();

/// Registers the `quantize` modifier with register_modifier (called by register_builtin_modifiers).
/// Its state (Modifier::state) is {"applied": bool}: whether the quantizers are attached.
void register_quantize_modifier();

}  // namespace whittle::runner
