// `whittle run RECIPE`: trains and evaluates as the recipe says, writing a run directory.

#include <boost/program_options.hpp>

#include <iostream>
#include <optional>

#include "core/error.h"
#include "core/file_util.h"
#include "runner/distributed.h"
#include "runner/recipe.h"
#include "runner/run_files.h"
#include "runner/trainer.h"
#include "tools/command.h"

namespace po = boost::program_options;

namespace whittle::cli {

int run_run(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle run RECIPE [--out DIR] [--set key=value]... [--resume [auto] | --overwrite] [--device cpu|cuda]\n\n"
      "Trains and evaluates the model of a YAML recipe (docs/recipes.md) and writes a run directory\n"
      "with the checkpoint, metrics.jsonl, report.json and a resumable training state.\n"
      "Ctrl-C saves the training state; --resume continues from it. A run directory that already holds\n"
      "a run is left alone unless --resume or --overwrite is given; one run at a time uses a directory.\n"
      "--resume auto resumes when the run directory holds a training state (a calibration, training.epochs 0: a\n"
      "finished report.json) and starts the run otherwise\n"
      "(for a job wrapper that always passes it, as a preemptible queue's does).\n\n"
      "example:\n  whittle run recipes/mnist/lenet5.yaml --set training.epochs=2 --out runs/quick\n\noptions");
  std::string recipe_path, out, device;
  std::vector<std::string> sets;
  opts.add_options()("help,h", "this text")("out", po::value<std::string>(&out), "run directory (default: recipe outputs.dir)")(
      "set", po::value<std::vector<std::string>>(&sets)->composing(), "override a recipe key: path.to.key=value (repeatable)")(
      "resume", "continue the run in the run directory; --resume auto: continue when it holds a training state, else start")(
      "resume-auto", "the same as --resume auto")(
      "overwrite", "replace a run already in the run directory")("device", po::value<std::string>(&device), "cpu, cuda or cuda:N");
  // "--resume auto" and "--resume=auto" are --resume-auto; a bare --resume stays a switch, so that
  // `whittle run --resume RECIPE` still reads RECIPE as the recipe.
  std::vector<std::string> given;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--resume" && i + 1 < args.size() && args[i + 1] == "auto") {
      given.push_back("--resume-auto");
      ++i;
    } else if (args[i].rfind("--resume=", 0) == 0) {
      const std::string mode = args[i].substr(9);
      if (mode != "auto")
        throw Error("run: --resume takes no value, or 'auto' (--resume auto), not '" + mode + "'", ErrorKind::kUsage);
      given.push_back("--resume-auto");
    } else {
      given.push_back(args[i]);
    }
  }
  po::variables_map vm = parse_command_line(given, opts, {{"recipe", &recipe_path}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (recipe_path.empty()) throw Error("run: missing RECIPE (see whittle run --help)", ErrorKind::kUsage);
  if (vm.count("out") && out.empty()) throw Error("run: --out is empty (give a directory)", ErrorKind::kUsage);
  if (vm.count("device") && device.empty()) throw Error("run: --device is empty (cpu, cuda or cuda:N)", ErrorKind::kUsage);
  if (!device.empty() && !runner::is_device_name(device))
    throw Error("--device '" + device + "': expected cpu, cuda or cuda:N", ErrorKind::kUsage);
  runner::Recipe recipe = runner::load_recipe(recipe_path, sets);
  runner::RunOptions ro;
  ro.out_dir = out;
  ro.device = device;
  const bool resume = vm.count("resume") > 0, resume_auto = vm.count("resume-auto") > 0;
  if (resume_auto && vm.count("overwrite"))
    throw Error("run: --resume auto continues a run and --overwrite replaces it: give one", ErrorKind::kUsage);
  // auto: resume only when a training state is there to resume from (a calibration, training.epochs
  // 0, saves none: its report.json says it finished).
  const std::string dir = out.empty() ? recipe.outputs.dir : out;
  const char* resumable = recipe.training.epochs == 0 ? runner::run_files::kReport : runner::run_files::kTrainState;
  ro.resume = resume || (resume_auto && path_exists(join_path(dir, resumable)));
  ro.overwrite = vm.count("overwrite") > 0;
  runner::install_sigint_handler();
  // Data-parallel when a launcher (torchrun, srun) says so: join the job's process group.
  std::shared_ptr<runner::ProcessGroup> group;
  if (const std::optional<runner::LaunchInfo> launch = runner::launch_from_environment()) {
    std::string dev = device.empty() ? recipe.training.device : device;
    if (dev == "cuda") dev = "cuda:" + std::to_string(launch->local_rank);  // one GPU a local rank
    ro.device = dev;
    runner::ProcessGroupOptions po;
    po.backend = recipe.distributed.backend;
    po.device = at::Device(dev);
    po.timeout_seconds = recipe.distributed.timeout_seconds;
    group = runner::ProcessGroup::connect(*launch, po);
    ro.group = group;
  }
  try {
    runner::RunResult res = runner::run_recipe(recipe, ro);
    return res.interrupted ? 130 : 0;
  } catch (const runner::Interrupted& e) {
    std::cerr << "whittle run: " << e.what() << "\n";
    return 130;
  } catch (const std::exception& e) {
    if (!group || group->broken()) throw;  // alone, or the failure came from another rank
    // This rank's own failure: the others learn it from the store and stop too.
    const std::string msg = message_of(e);
    group->report_failure(msg);
    const auto* err = dynamic_cast<const Error*>(&e);
    throw Error("rank " + std::to_string(group->rank()) + ": " + msg, err ? err->kind() : ErrorKind::kRuntime);
  }
}

}  // namespace whittle::cli
