#pragma once
// DoReFa's activation quantizer, shared by the methods that quantize activations with it (dorefa,
// twn). Internal to quantize/.

#include <cstdint>
#include <optional>
#include <string>

#include "quantize/method.h"

namespace whittle::quantize {

/// Throws whittle::Error "quantize: activation_clip = ..." for a clip that is not a finite value
/// > 0, or one other than 1 when activations are not quantized (activation_bits 32).
void check_activation_clip(double clip, int64_t activation_bits, const std::string& method);
/// The act_quant plan of DoReFa activations at `activation_bits` with clip level
/// `activation_clip` (the attribute is left out at 1); nullopt at 32 bits.
std::optional<ActivationPlan> dorefa_activation_plan(int64_t activation_bits, double activation_clip);

}  // namespace whittle::quantize
