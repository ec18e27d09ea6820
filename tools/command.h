#pragma once
// Subcommands of the `whittle` program. Each takes the arguments after its name and returns
// the process exit code: 0 on success, 1 on a runtime failure, 2 on a usage or recipe error.

#include <functional>
#include <string>
#include <vector>

namespace whittle::cli {

/// One subcommand: its name, a one-line summary for `whittle --help`, and its entry point.
struct Command {
  std::string name;
  std::string summary;
  std::function<int(const std::vector<std::string>& args)> run;
};

/// All subcommands, in the order `whittle --help` lists them.
const std::vector<Command>& commands();

int run_inspect(const std::vector<std::string>& args);
int run_run(const std::vector<std::string>& args);
int run_eval(const std::vector<std::string>& args);
int run_data(const std::vector<std::string>& args);
int run_keys(const std::vector<std::string>& args);
int run_fuse(const std::vector<std::string>& args);

}  // namespace whittle::cli
