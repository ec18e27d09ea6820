#pragma once
// Export formats as registry entries (DESIGN.md, "Extension points"). An Exporter owns its name,
// the file extensions it writes, its options (bound to keys once: `whittle export` flags, the
// recipe's outputs.<format>_<option> keys, `whittle keys`), a check that needs no file (run before
// training, so a run never trains a model it cannot export), the atomic write, and the verification
// of a written file. `whittle export`, the recipe's `outputs.export` and the trainer ask the
// registry; ONNX (onnx_exporter.cpp) and TorchScript (torchscript_exporter.cpp) are two entries, and
// a new format is one file plus its registration line.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/options.h"
#include "core/registry.h"
#include "export/verify.h"
#include "graph/graph.h"

namespace whittle {

/// What the caller of an export knows beside the graph and the options.
struct ExportInfo {
  /// Free-form facts about the source written where the format has room (ONNX metadata_props),
  /// e.g. {"source": "runs/mnist/lenet5/model.h5"}.
  std::map<std::string, std::string> metadata;
};

/// One export format (see the top of this file). Implementations are stateless.
class Exporter {
 public:
  virtual ~Exporter() = default;
  /// Registry key, e.g. "onnx".
  virtual std::string name() const = 0;
  /// One line with the format's spec, for `whittle inspect --exporters`.
  virtual std::string description() const = 0;
  /// The file extensions it writes, with the dot; the first is the one a recipe's export uses.
  virtual std::vector<std::string> extensions() const = 0;
  /// Its options (keys of the Settings given to check and write), with types, defaults, ranges.
  virtual std::vector<KeySpec> option_keys() const { return {}; }
  /// Checks that `graph` can be written with `options` without writing anything. Throws
  /// whittle::Error naming the node for an op without a form, and (usage) naming a bad option.
  virtual void check(const Graph& graph, const Settings& options) const = 0;
  /// Writes `graph` to `path` atomically (nothing is left behind on error). Throws like check,
  /// or naming the path when it cannot be written.
  virtual void write(const Graph& graph, const std::string& path, const Settings& options, const ExportInfo& info) const = 0;
  /// What was written, for the user: "ONNX, opset 17".
  virtual std::string summary(const Settings& options) const = 0;
  /// The batch size of the check data a written file accepts (its fixed batch, when `options`
  /// fix one); default 4.
  virtual int64_t check_batch(const Graph& graph, const Settings& options) const { return 4; }
  /// Whether verify() runs the file on check data (it then needs `data`).
  virtual bool verify_runs() const { return false; }
  /// Reads a file written by write() back and checks it: that it parses and, where verify_runs(),
  /// that its outputs on `data` match whittle's. Returns one line for the user. Throws
  /// whittle::Error naming the path when the file does not pass.
  virtual std::string verify(const std::string& path, const CheckData* data) const = 0;
};

/// The exporter registry ("exporters" in `whittle inspect`).
Registry<Exporter>& exporters();
/// Registers (or replaces) an exporter under its name().
void register_exporter(std::unique_ptr<Exporter> exporter);
/// The exporter `name`; throws whittle::Error (usage) naming it and listing the known ones.
const Exporter& exporter(const std::string& name);
/// The exporter whose extensions include the extension of `path` (compared case-sensitively);
/// nullptr when none does.
const Exporter* exporter_for_path(const std::string& path);
/// Checks `options` against `exporter`'s keys before any work: throws whittle::Error (usage)
/// "<where>: <key> applies to format F only, not E" for a key it lacks (naming the exporters that
/// have it), and "<where>, key '<key>': V is outside R" for a number outside the key's range.
void check_export_options(const Exporter& exporter, const Settings& options, const std::string& where);

}  // namespace whittle
