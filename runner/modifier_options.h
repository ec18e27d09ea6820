#pragma once
// Typed modifier options: OptionsSchema (core/options.h) binds each field of a modifier's options
// struct to a recipe key, so every default is written once:
//
//   info.settings = schema().keys();   // KeySpecs: sparsity number 0.5, criterion string l1
//   PruneOptions o = schema().parse(spec.settings, spec.location + ": modifier 'prune'");

#include "core/options.h"
#include "runner/recipe.h"

namespace whittle::runner {
using whittle::OptionsSchema;
}  // namespace whittle::runner
