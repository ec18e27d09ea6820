#pragma once
// What the binary methods (bnn, xnor) share. Internal to quantize/.

#include <optional>
#include <string>

#include "quantize/method.h"

namespace whittle::quantize {

/// `in` with weight_bits and activation_bits defaulting to 1; throws whittle::Error naming the key
/// unless each is 1 or 32.
Config resolve_binary(const Config& in, const std::string& method);
/// The sign binarizer's act_quant plan; nullopt at activation_bits 32.
std::optional<ActivationPlan> sign_activation_plan(const Config& c);

}  // namespace whittle::quantize
