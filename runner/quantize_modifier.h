#pragma once
// The recipe modifier `quantize` (quantization-aware training; see quantize/quantize.h and
// docs/quantization.md).

namespace whittle::runner {

/// Registers the `quantize` modifier with register_modifier (called by register_builtin_modifiers).
void register_quantize_modifier();

}  // namespace whittle::runner
