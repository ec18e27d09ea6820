// The TorchScript exporter entry: `whittle export --format torchscript`, the recipe's
// outputs.export: [torchscript] (torchscript_export.h has the forms).

#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "export/exporter.h"
#include "export/torchscript_export.h"

namespace whittle {

namespace {

class TorchScriptExporter final : public Exporter {
 public:
  std::string name() const override { return "torchscript"; }
  std::string description() const override {
    return "TorchScript module of plain ATen ops (torch.jit.load runs it without whittle), bitwise equal to whittle's eval";
  }
  std::vector<std::string> extensions() const override { return {".pt", ".ts", ".torchscript"}; }
  void check(const Graph& graph, const Settings&) const override { torchscript_source(graph); }
  void write(const Graph& graph, const std::string& path, const Settings&, const ExportInfo&) const override {
    export_torchscript(graph, path);
  }
  std::string summary(const Settings&) const override { return "TorchScript"; }
  bool verify_runs() const override { return true; }
  std::string verify(const std::string& path, const CheckData* data) const override {
    if (!data) throw Error("verify " + path + ": TorchScript verification needs check data");
    const ExportCheck c = verify_torchscript_file(*data, path);
    const double rel = c.max_abs_output > 0 ? c.max_abs_difference / c.max_abs_output : c.max_abs_difference;
    std::ostringstream os;
    os << "torch::jit::load(" << path << ") on " << c.batch << " random inputs: largest difference " << std::setprecision(3)
       << c.max_abs_difference << " (" << rel << " of the largest output " << c.max_abs_output << ")"
       << (c.bitwise_equal ? ", bitwise equal" : "");
    if (!(rel <= 1e-5))
      throw Error("export: the TorchScript file's outputs differ from whittle's by " + std::to_string(rel) +
                  " of the largest output (bound 1e-5)");
    return os.str();
  }
};

}  // namespace

void register_torchscript_exporter() { register_exporter(std::make_unique<TorchScriptExporter>()); }

}  // namespace whittle
