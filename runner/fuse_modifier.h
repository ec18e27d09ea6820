#pragma once
// The recipe modifier `fuse_batchnorm` (BN folding for inference or during quantization-aware
// training; see fuse/fuse.h and docs/fusion.md).

#include <string>

#include "fuse/fuse.h"
#include "runner/modifier_options.h"

namespace whittle::runner {

/// Settings of the `fuse_batchnorm` modifier. repvgg and threshold take fuse::InferenceOptions'
/// defaults.
struct FuseBatchNormModifierOptions {
  std::string mode = "inference";  ///< inference: fold at the end; qat: train with the folded weight
  double freeze_bn_epoch = -1;     ///< qat: epoch from which the BN statistics are frozen (−1: never)
  bool repvgg = fuse::InferenceOptions{}.repvgg;        ///< at the end, merge RepVGG blocks
  bool threshold = fuse::InferenceOptions{}.threshold;  ///< at the end, BN + sign → thresholds
};

/// The recipe keys of FuseBatchNormModifierOptions (the modifier's settings schema).
const OptionsSchema<FuseBatchNormModifierOptions>& fuse_modifier_schema();

/// Registers the `fuse_batchnorm` modifier with register_modifier (called by register_builtin_modifiers).
/// Its state (Modifier::state) is {"prepared": bool, "frozen": bool}: whether the layer+BN pairs
/// were turned into conv_bn_qat nodes, and whether their statistics were frozen (mode qat).
void register_fuse_modifier();

}  // namespace whittle::runner
