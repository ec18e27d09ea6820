#pragma once
// The pass registry: every graph pass whittle ships (BN folding, RepVGG merging, thresholds, the
// QAT passes, quantization; later pruning and export passes) under a name, with a description and
// its options, the way modifiers are listed for recipes. `whittle inspect --passes` prints it.
// Each module registers its passes through its registration function (op_registry.h,
// WHITTLE_REGISTER_MODULE).

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/registry.h"
#include "graph/graph.h"

namespace whittle {

/// One option of a pass.
struct PassOption {
  std::string name;           ///< "repvgg"
  std::string type;           ///< "bool", "int", "float", "string" or "list"
  std::string default_value;  ///< as text ("true")
  std::string description;
};

/// Option values as text (name → value, lists comma-separated), as the command line gives them.
using PassOptionValues = std::map<std::string, std::string>;

/// A registered graph pass.
struct PassInfo {
  std::string name;         ///< registry key, e.g. "fold_batchnorm"
  std::string module;       ///< the module that owns it ("fuse", "quantize")
  std::string description;  ///< one line, with the paper or rule it implements
  std::vector<PassOption> options;
  /// Runs the pass on `graph` with `options` (unknown names and malformed values are rejected by
  /// run_pass first) and returns its report as text. Throws whittle::Error from the pass.
  std::function<std::string(Graph& graph, const PassOptionValues& options)> run;
};

/// The pass registry ("passes" in `whittle inspect`).
Registry<PassInfo>& passes();
/// Registers (or replaces) a pass.
void register_pass(PassInfo info);
/// The pass `name`; throws whittle::Error (usage) listing the known passes.
const PassInfo& pass_info(const std::string& name);
/// Registered pass names, sorted.
std::vector<std::string> pass_names();
/// Checks `options` against the pass's declared options (a usage whittle::Error naming the
/// unknown option and listing the valid ones), then runs it; returns the report.
std::string run_pass(const std::string& name, Graph& graph, const PassOptionValues& options = {});

/// Option parsing for pass implementations: the value of `name` in `options`, or `fallback`.
/// Throw a usage whittle::Error naming the option when the text is not of the type.
bool pass_option_bool(const PassOptionValues& options, const std::string& name, bool fallback);
int64_t pass_option_int(const PassOptionValues& options, const std::string& name, int64_t fallback);
double pass_option_float(const PassOptionValues& options, const std::string& name, double fallback);
std::string pass_option_string(const PassOptionValues& options, const std::string& name, const std::string& fallback);
/// A comma-separated list ("conv1,layer1.*"); empty when absent.
std::vector<std::string> pass_option_list(const PassOptionValues& options, const std::string& name);

}  // namespace whittle
