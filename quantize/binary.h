#pragma once
// What the binary methods (bnn, xnor) share: widths 1 or 32, their weight quantizer of the
// method's own name, and the sign binarizer on activations. Internal to quantize/.

#include <optional>
#include <string>

#include "quantize/method.h"

namespace whittle::quantize {

/// The sign binarizer's act_quant plan; nullopt at activation_bits 32.
std::optional<ActivationPlan> sign_activation_plan(const Config& c);

/// A binary method with options `Options`: weight_bits and activation_bits default to 1 and are
/// 1 or 32; weights go through the weight quantizer named as the method, activations through sign.
template <typename Options>
class BinaryMethod : public MethodWithOptions<Options> {
 public:
  std::string weight_bits_text() const override { return "1 or 32"; }
  std::string activation_bits_text() const override { return "1 or 32"; }
  Config resolve(const Config& in) const override {
    Config c = in;
    if (c.weight_bits == 0) c.weight_bits = 1;
    if (c.activation_bits == 0) c.activation_bits = 1;
    if (c.weight_bits != 1 && c.weight_bits != 32) bad_bits(this->name(), "weight_bits", c.weight_bits, "1 or 32");
    if (c.activation_bits != 1 && c.activation_bits != 32)
      bad_bits(this->name(), "activation_bits", c.activation_bits, "1 or 32");
    this->options(c);  // checks the keys given
    return c;
  }
  std::string weight_quantizer(const Config& c) const override { return c.weight_bits == 32 ? "" : this->name(); }
  std::optional<ActivationPlan> activations(const Config& c) const override { return sign_activation_plan(c); }
};

}  // namespace whittle::quantize
