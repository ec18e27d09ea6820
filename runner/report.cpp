#include "runner/report.h"

#include <nlohmann/json.hpp>

#include <iomanip>
#include <ostream>

#include "core/file_util.h"
#include "graph/version.h"

namespace whittle::runner {

namespace {

std::string model_label(const Recipe& r) { return r.model.name.empty() ? r.model.file : r.model.name; }

}  // namespace

void write_report(const std::string& path, const Recipe& r, const RunResult& result, const std::string& device) {
  nlohmann::ordered_json report;
  report["recipe"] = r.path;
  report["model"] = model_label(r);
  report["test_top1"] = result.test.top1;
  report["test_top5"] = result.test.top5;
  report["test_loss"] = result.test.loss;
  report["test_images"] = result.test.samples;
  report["epochs"] = result.epochs_done;
  report["params"] = result.params;
  report["macs_per_image"] = result.macs;
  report["checkpoint"] = result.checkpoint;
  report["checkpoint_bytes"] = result.checkpoint_bytes;
  report["wall_seconds"] = result.wall_seconds;
  report["train_images_per_second"] = result.train_images_per_second;
  if (!result.loss_terms.empty()) report["loss_terms"] = result.loss_terms;
  for (const auto& [format, path] : result.exports)
    report["exports"][format] = {{"path", path}, {"bytes", result.export_bytes.count(format) ? result.export_bytes.at(format) : 0}};
  report["device"] = device;
  // Float results depend on these (docs/reproducibility.md).
  report["cpu_capability"] = cpu_capability();
  report["intra_op_threads"] = intra_op_threads();
  report["seed"] = r.training.seed;
  report["deterministic"] = r.training.deterministic;
  report["torch_version"] = torch_version();
  write_file_atomic(path, report.dump(2) + "\n");
}

void print_report(std::ostream& log, const Recipe& r, const RunResult& result, const std::string& report_path) {
  log << "\n"
      << "  result                 " << model_label(r) << "\n"
      << "  test top-1             " << std::fixed << std::setprecision(2) << 100 * result.test.top1 << " %\n"
      << "  test top-5             " << 100 * result.test.top5 << " %\n"
      << "  test loss              " << std::setprecision(4) << result.test.loss << "\n"
      << "  parameters             " << result.params << "\n"
      << "  MACs per image         " << result.macs << "\n"
      << "  checkpoint             " << result.checkpoint << " (" << result.checkpoint_bytes << " bytes)\n"
      ;
  for (const auto& [format, path] : result.exports)
    log << "  " << std::left << std::setw(23) << (format + " export") << std::right << path << " ("
        << (result.export_bytes.count(format) ? result.export_bytes.at(format) : 0) << " bytes)\n";
  log << "  wall time              " << std::setprecision(1) << result.wall_seconds << " s\n"
      << "  training speed         " << std::setprecision(0) << result.train_images_per_second << " images/s\n";
  for (const auto& [k, v] : result.loss_terms)
    log << "  " << std::left << std::setw(23) << k << std::right << std::setprecision(4) << v << " (last epoch's mean)\n";
  log
      << "  report                 " << report_path << "\n";
}

}  // namespace whittle::runner
