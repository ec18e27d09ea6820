#pragma once
// The one registration entry point. Every module above graph/ (quantize, fuse, runner's modifiers,
// and the modules to come) adds one registration function that registers its ops, weight
// transforms, passes and modifiers; every registry lookup runs the pending ones first. (graph's
// own built-in ops and its mask transform are registered by the op registry on first use.)
// Loading a checkpoint, the command-line program and a program linking the installed library
// all go through it, so no caller has to remember to register anything.

#include <string>
#include <vector>

namespace whittle {

/// Adds a module's registration function (its ops, weight transforms, passes, modifiers) to the
/// process-wide list, once per `module` name. Modules call it from a static initializer in the
/// file that defines their registration (WHITTLE_REGISTER_MODULE), so linking a module is enough:
/// no caller has to remember to register anything before loading a checkpoint or a recipe.
void add_module_registration(const std::string& module, void (*registration)());
/// Runs every added registration that has not run yet, in the order they were added. Every
/// registry lookup (op_traits, has_op, registered_ops, weight_transform, the pass and modifier
/// registries) calls it first; calling it directly is harmless. Reentrant from a registration.
void ensure_registered();
/// Names of the modules whose registration was added, in order.
std::vector<std::string> registered_modules();

/// Adds `fn` as the registration of `module` when the enclosing object file is linked.
#define WHITTLE_REGISTER_MODULE(module, fn)                                               \
  namespace {                                                                             \
  const bool whittle_module_registered_ = (::whittle::add_module_registration(module, fn), true); \
  }

}  // namespace whittle
