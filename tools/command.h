#pragma once
// Subcommands of the `whittle` program. Each takes the arguments after its name and returns
// the process exit code: 0 on success, 1 on a runtime failure, 2 on a usage or recipe error, 130
// when Ctrl-C stopped `whittle run` (training state saved).

#include <boost/program_options/options_description.hpp>
#include <boost/program_options/variables_map.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace whittle::cli {

/// One subcommand: its name, a one-line summary for `whittle --help`, and its entry point.
struct Command {
  std::string name;
  std::string summary;
  std::function<int(const std::vector<std::string>& args)> run;
};

/// Parses a subcommand's arguments against `options` (what --help shows) plus positional
/// arguments, each stored into its string, in order ({"model", &model}). Throws
/// boost::program_options::error for unknown options, missing values or extra positionals
/// (reported by main as a usage error, exit code 2).
boost::program_options::variables_map parse_command_line(
    const std::vector<std::string>& args, const boost::program_options::options_description& options,
    const std::vector<std::pair<const char*, std::string*>>& positionals = {});

/// Checks, writing nothing, that subcommand `command` can write a file at `path` (given as option
/// `what`, e.g. "--out"): not a directory (nor a name ending in '/'), not an existing FIFO, device
/// or socket, in an existing folder it may write into. Called before
/// any work, so that a long computation does not end on an output it cannot write. Throws
/// whittle::Error: a usage error (exit 2) for a directory or a missing folder, a runtime error for
/// a folder without write permission. An existing regular file is refused (a usage error naming it)
/// unless `overwrite` (the command's --overwrite) is set.
void check_writable_file(const std::string& command, const std::string& path, const std::string& what, bool overwrite);

/// All subcommands, in the order `whittle --help` lists them.
const std::vector<Command>& commands();

int run_inspect(const std::vector<std::string>& args);
int run_run(const std::vector<std::string>& args);
int run_eval(const std::vector<std::string>& args);
int run_data(const std::vector<std::string>& args);
int run_keys(const std::vector<std::string>& args);
int run_fuse(const std::vector<std::string>& args);
int run_prune(const std::vector<std::string>& args);
int run_calibrate(const std::vector<std::string>& args);
int run_export(const std::vector<std::string>& args);
int run_report(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);

}  // namespace whittle::cli
