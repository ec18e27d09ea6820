#pragma once
// The pass registry: every graph pass whittle ships (BN folding, RepVGG merging, thresholds, the
// QAT passes, quantization, pruning) under a name, with a description and its options as typed
// keys (core/options.h), the way modifiers are listed for recipes. `whittle inspect --passes`
// prints it, and the commands that run a pass (`whittle fuse`, `whittle prune`) take their flags
// from its keys and run it through run_pass(), so a registered pass is a usable pass. Each module
// registers its passes through its registration function (op_registry.h, WHITTLE_REGISTER_MODULE).
//
//   register_pass(make_pass("fold_batchnorm", "fuse", "folds BN into the layer before it",
//                           fold_options_schema(),
//                           [](Graph& g, const FoldOptions& o, const PassCall&) {
//                             return fold_batchnorm(g, o).summary();
//                           }));
//   run_pass("fold_batchnorm", graph, settings);   // settings: only the keys given

#include <functional>
#include <string>
#include <vector>

#include "core/options.h"
#include "core/registry.h"
#include "graph/graph.h"

namespace whittle {

/// One call of a pass: the settings given (only the keys given; the options struct holds the
/// defaults) and where they came from, so that messages name a recipe key or a command's flag.
struct PassCall {
  Settings settings;
  OptionSource source;
};

/// A registered graph pass.
struct PassInfo {
  std::string name;         ///< registry key, e.g. "fold_batchnorm"
  std::string module;       ///< the module that owns it ("fuse", "quantize")
  std::string description;  ///< one line, with the paper or rule it implements
  std::vector<KeySpec> options;  ///< its options: names, types, defaults, ranges, choices
  /// Runs the pass on `graph` (the settings are checked against `options` first, by the pass's
  /// schema) and returns its report as text. Throws whittle::Error from the pass; a usage error
  /// naming the option (as the call's source spells it) for a bad setting.
  std::function<std::string(Graph& graph, const PassCall& call)> run;
};

/// A PassInfo whose options are the keys of `schema` (a static OptionsSchema, which must outlive
/// the registry) and whose run parses the call's settings with it, then calls
/// `fn(graph, options, call)`, which returns the report text.
template <class Options, class Fn>
PassInfo make_pass(std::string name, std::string module, std::string description, const OptionsSchema<Options>& schema,
                   Fn fn) {
  PassInfo p{std::move(name), std::move(module), std::move(description), schema.keys(), {}};
  p.run = [&schema, fn](Graph& graph, const PassCall& call) {
    return fn(graph, schema.parse(call.settings, call.source), call);
  };
  return p;
}

/// The pass registry ("passes" in `whittle inspect`).
Registry<PassInfo>& passes();
/// Registers (or replaces) a pass; throws whittle::Error without a name or a run function.
void register_pass(PassInfo info);
/// The pass `name`; throws whittle::Error (usage) listing the known passes.
const PassInfo& pass_info(const std::string& name);
/// Registered pass names, sorted.
std::vector<std::string> pass_names();
/// Runs the pass `name` on `graph` with `call` (default: no settings, messages naming
/// "pass '<name>'" and recipe keys) and returns its report. Throws as PassInfo::run.
std::string run_pass(const std::string& name, Graph& graph, const PassCall& call);
std::string run_pass(const std::string& name, Graph& graph, const Settings& settings = {});

}  // namespace whittle
