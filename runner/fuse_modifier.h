#pragma once
// The recipe modifier `fuse_batchnorm` (BN folding for inference or during quantization-aware
// training; see fuse/fuse.h and docs/fusion.md).

namespace whittle::runner {

/// Registers the `fuse_batchnorm` modifier with register_modifier (called by register_builtin_modifiers).
void register_fuse_modifier();

}  // namespace whittle::runner
