// `whittle report RUN_DIR...`: compares finished runs: a table on stdout, --json for scripts, and
// --html for one self-contained page with the curves, the accuracy-size Pareto chart and the layer
// tables (tools/report_html.h).

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "core/error.h"
#include "core/file_util.h"
#include "tools/command.h"
#include "tools/report_html.h"

namespace po = boost::program_options;

namespace whittle::cli {

namespace {

/// Refuses an --html target before any work: it must be writable (check_writable_file), and not an
/// existing file of a given run directory (report.json, the checkpoint, metrics.jsonl, or any
/// other), which the page would replace, even with --overwrite; only an earlier page there (.html,
/// .htm) may be replaced, and any existing file only with --overwrite.
void check_html_target(const std::string& html, const std::vector<std::string>& dirs, bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target(html);
  std::string ext = target.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (fs::exists(target, ec) && ext != ".html" && ext != ".htm") {
    const fs::path where = fs::absolute(target, ec).parent_path();
    for (const auto& dir : dirs)
      if (fs::equivalent(where, fs::path(dir), ec))
        throw Error("report: --html " + html + " would replace a file of the run in " + dir +
                        " (give a .html name, or a file outside the run directory)",
                    ErrorKind::kUsage);
  }
  check_writable_file("report", html, "--html", overwrite);
}

}  // namespace

int run_report(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle report RUN_DIR... [--html FILE [--overwrite]] [--title TEXT] [--json]\n\n"
      "Compares finished runs (directories `whittle run` wrote: report.json, metrics.jsonl, recipe.yaml):\n"
      "a table of method, epochs, test top-1/top-5, checkpoint bytes, parameters, MACs and training time.\n"
      "--html writes one self-contained page (inline SVG, no script, no network): test top-1 per epoch of\n"
      "every run, accuracy against checkpoint size with the Pareto front, and per run its loss and top-1\n"
      "curves and layer table.\n\n"
      "example:\n  whittle report runs/cifar10/resnet20_budget runs/cifar10/resnet20_budget_* --html report.html\n\noptions");
  std::string html, title = "whittle runs";
  opts.add_options()("help,h", "this text")("html", po::value<std::string>(&html), "write the HTML page to FILE")(
      "overwrite", "replace an existing --html file")(
      "title", po::value<std::string>(&title), "the page's title")("json", "print the runs as JSON instead of the table")(
      "dirs", po::value<std::vector<std::string>>(), "run directories");
  po::positional_options_description pos;
  pos.add("dirs", -1);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).positional(pos).run(), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (!vm.count("dirs")) throw Error("report: missing RUN_DIR (see whittle report --help)", ErrorKind::kUsage);
  if (vm.count("html") && html.empty()) throw Error("report: --html is empty (give a file name)", ErrorKind::kUsage);
  if (!html.empty() && is_directory(html)) throw Error("report: --html " + html + " is a directory", ErrorKind::kUsage);
  const auto& dirs = vm["dirs"].as<std::vector<std::string>>();
  if (!html.empty()) check_html_target(html, dirs, vm.count("overwrite") > 0);
  std::vector<RunSummary> runs;
  for (size_t i = 0; i < dirs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (resolved_path(dirs[i]) == resolved_path(dirs[j]))
        throw Error("report: " + dirs[i] + " is given twice (also as " + dirs[j] + ")", ErrorKind::kUsage);
  for (const auto& dir : dirs) runs.push_back(read_run(dir));
  assign_labels(runs);

  if (vm.count("json")) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    const std::vector<size_t> front = pareto_front(runs);
    for (size_t i = 0; i < runs.size(); ++i) {
      const RunSummary& r = runs[i];
      out.push_back({{"dir", r.dir},
                     {"label", r.label},
                     {"model", r.model},
                     {"method", r.method},
                     {"tool", r.tool},
                     {"epochs", r.epochs},
                     {"test_top1", r.test_top1},
                     {"test_top5", r.test_top5},
                     {"test_loss", std::isnan(r.test_loss) ? nlohmann::ordered_json() : nlohmann::ordered_json(r.test_loss)},
                     {"test_images", r.test_images},
                     {"checkpoint_bytes", r.checkpoint_bytes},
                     {"params", r.params},
                     {"macs_per_image", r.macs},
                     {"training_seconds", r.training_seconds >= 0 ? nlohmann::ordered_json(r.training_seconds)
                                                                  : nlohmann::ordered_json()},
                     {"training_seconds_from_wall", r.training_seconds_from_wall},
                     {"pareto_front", std::find(front.begin(), front.end(), i) != front.end()}});
    }
    std::cout << out.dump(2) << "\n";
  } else {
    size_t wl = 3, wm = 6;
    for (const auto& r : runs) wl = std::max(wl, r.label.size()), wm = std::max(wm, r.method.size());
    std::cout << std::left << std::setw(static_cast<int>(wl) + 2) << "run" << std::setw(static_cast<int>(wm) + 2) << "method"
              << std::right << std::setw(7) << "epochs" << std::setw(9) << "top-1" << std::setw(9) << "top-5" << std::setw(13)
              << "checkpoint" << std::setw(11) << "params" << std::setw(13) << "MACs" << std::setw(10) << "time" << "\n";
    for (const auto& r : runs) {
      std::cout << std::left << std::setw(static_cast<int>(wl) + 2) << r.label << std::setw(static_cast<int>(wm) + 2)
                << r.method << std::right << std::setw(7) << r.epochs << std::fixed << std::setprecision(2) << std::setw(7)
                << 100 * r.test_top1 << " %" << std::setw(7) << 100 * r.test_top5 << " %" << std::setw(11)
                << r.checkpoint_bytes << " B" << std::setw(11) << r.params << std::setw(13) << r.macs;
      if (r.training_seconds >= 0)
        std::cout << std::setw(8) << std::setprecision(1) << r.training_seconds / 60 << " m"
                  << (r.training_seconds_from_wall ? "*" : "");
      else
        std::cout << std::setw(10) << "—";
      std::cout << "\n";
    }
  }
  if (!html.empty()) {
    write_file_atomic(html, render_report_html(runs, title));
    std::cerr << "wrote " << html << " (" << runs.size() << " runs)\n";
  }
  return 0;
}

}  // namespace whittle::cli
