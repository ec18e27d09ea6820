// The `whittle` command-line program: dispatches to subcommands (see command.h).

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <boost/program_options.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "graph/version.h"
#include "tools/command.h"

namespace whittle::cli {

boost::program_options::variables_map parse_command_line(
    const std::vector<std::string>& args, const boost::program_options::options_description& options,
    const std::vector<std::pair<const char*, std::string*>>& positionals) {
  namespace po = boost::program_options;
  po::options_description hidden;
  po::positional_options_description pos;
  for (const auto& [name, target] : positionals) {
    hidden.add_options()(name, po::value<std::string>(target));
    pos.add(name, 1);
  }
  po::options_description all;
  all.add(options).add(hidden);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
  po::notify(vm);
  return vm;
}

void check_writable_file(const std::string& command, const std::string& path, const std::string& what, bool overwrite) {
  if (is_directory(path) || (!path.empty() && path.back() == '/'))
    throw Error(command + ": " + what + " " + path + " is a directory", ErrorKind::kUsage);
  if (path_exists(path) && !is_regular_file(path))
    throw Error(command + ": " + what + " " + path + " is " + describe_path(path) + ", not a file to replace",
                ErrorKind::kUsage);
  if (path_exists(path) && !overwrite)
    throw Error(command + ": " + what + " " + path + " exists (" + describe_path(path) +
                    "); give --overwrite to replace it",
                ErrorKind::kUsage);
  const std::string dir = parent_directory(path);
  const std::string d = dir.empty() ? "." : dir;
  if (!is_directory(d))
    throw Error(command + ": cannot write " + what + " " + path + ": " + d + " is " + describe_path(d) +
                    " (not a folder to write into)",
                ErrorKind::kUsage);
  if (::access(d.c_str(), W_OK) != 0)
    throw Error(command + ": " + what + " " + path + ": cannot write into " + d + " (" + std::strerror(errno) + ")");
}

const std::vector<Command>& commands() {
  static const std::vector<Command> all = {
      {"run", "train and evaluate a YAML recipe, writing a run directory", run_run},
      {"eval", "evaluate a checkpoint on a dataset", run_eval},
      {"inspect", "per-node table of a model: shapes, parameters, MACs, weight bits", run_inspect},
      {"fuse", "fold batch norms, merge RepVGG blocks, BN+sign to thresholds: fuse MODEL --out FILE", run_fuse},
      {"prune", "remove channels: prune MODEL --target-macs 0.5 --out FILE (docs/pruning.md)", run_prune},
      {"calibrate", "post-training int8: calibrate MODEL --data D --method entropy --out FILE (docs/quantization.md)",
       run_calibrate},
      {"export", "write ONNX or TorchScript: export MODEL --out FILE.onnx|FILE.pt [--verify] (docs/export.md)",
       run_export},
      {"bench", "deploy runtime vs float latency, per step: bench MODEL [--batch N] [--threads T] (docs/kernels.md)",
       run_bench},
      {"report", "compare finished runs: table, --json, or --html FILE with curves and the Pareto chart", run_report},
      {"data", "dataset tools: data pack SRC --to FILE.h5", run_data},
      {"keys", "list every recipe key and modifier setting", run_keys},
  };
  return all;
}

}  // namespace whittle::cli

namespace {

void print_version() {
  std::cout << "whittle " << whittle::version() << " (git " << whittle::git_revision() << ")\n"
            << "LibTorch " << whittle::torch_version()
            << (whittle::built_with_cuda() ? ", CUDA code paths built" : ", CPU only") << "\n"
            << "ATen CPU capability " << whittle::cpu_capability() << ", intra-op threads "
            << whittle::intra_op_threads() << " (float results depend on both: docs/reproducibility.md)\n";
}

void print_usage(std::ostream& os) {
  os << "whittle " << whittle::version() << ": model compression on LibTorch\n\n"
     << "usage: whittle <command> [options]    (whittle <command> --help for its options)\n\n"
     << "commands:\n";
  for (const auto& c : whittle::cli::commands()) {
    os << "  " << c.name << std::string(c.name.size() < 12 ? 12 - c.name.size() : 1, ' ') << c.summary << "\n";
  }
  os << "\noptions:\n  --version   print whittle's and LibTorch's versions\n  --help      this text\n"
     << "\nexamples:\n  whittle run recipes/mnist/lenet5.yaml\n  whittle inspect resnet20 --input-shape 1,3,32,32\n";
}

// `rc`, or 1 when standard output could not be written (a full disk, /dev/full, a closed file):
// what was printed is flushed and checked, so that a result nobody received is not a success.
// Says so on standard error, as `who`.
int checked_output(const std::string& who, int rc) {
  errno = 0;
  std::cout.flush();
  const bool stream_failed = !std::cout.good();
  const bool flush_failed = std::fflush(stdout) != 0 || std::ferror(stdout);
  if (!stream_failed && !flush_failed) return rc;
  const int err = errno;
  std::cerr << who << ": error: cannot write to standard output"
            << (err != 0 ? std::string(" (") + std::strerror(err) + ")" : "") << "\n";
  return rc == 0 ? 1 : rc;
}

// The command's exit code with its output checked (checked_output).
int run_command(const whittle::cli::Command& c, const std::vector<std::string>& rest);

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(std::cerr);
    return 2;
  }
  // `whittle help CMD` is `whittle CMD --help`.
  if (args[0] == "help" && args.size() == 2) args = {args[1], "--help"};
  const std::string first = args[0];
  if (first == "--version" || first == "-V" || first == "--help" || first == "-h" || first == "help") {
    if (args.size() > 1) {
      std::cerr << "whittle: " << first << " takes no arguments (got '" << args[1] << "')\n";
      return 2;
    } else if (first == "--version" || first == "-V") {
      print_version();
      return checked_output("whittle", 0);
    } else {
      print_usage(std::cout);
      return checked_output("whittle", 0);
    }
  }
  for (const auto& c : whittle::cli::commands()) {
    if (c.name != first) continue;
    std::vector<std::string> rest(args.begin() + 1, args.end());
    return checked_output("whittle " + c.name, run_command(c, rest));
  }
  std::cerr << "whittle: unknown command '" << first << "'\n\n";
  print_usage(std::cerr);
  return 2;
}

namespace {

int run_command(const whittle::cli::Command& c, const std::vector<std::string>& rest) {
  try {
    return c.run(rest);
  } catch (const boost::program_options::error& e) {
    std::cerr << "whittle " << c.name << ": " << e.what() << " (see whittle " << c.name << " --help)\n";
    return 2;
  } catch (const whittle::Error& e) {
    std::cerr << "whittle " << c.name << ": error: " << e.what() << "\n";
    return e.kind() == whittle::ErrorKind::kUsage ? 2 : 1;
  } catch (const c10::Error& e) {
    // LibTorch's message alone: its C++ backtrace says nothing to a user.
    std::string msg = e.what_without_backtrace();
    if (const size_t nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    // The CPU allocator's failure is an enforce message ("[enforce fail at alloc_cpu.cpp:N] err
    // == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. ..."; "not
    // enough memory" in other versions): what it means first, then the allocator's own words.
    if (msg.find("DefaultCPUAllocator") != std::string::npos &&
        (msg.find("allocate memory") != std::string::npos || msg.find("not enough memory") != std::string::npos)) {
      const size_t from = msg.find("DefaultCPUAllocator");
      std::cerr << "whittle " << c.name << ": error: out of memory ("
                << msg.substr(from == std::string::npos ? 0 : from) << ")\n";
      return 1;
    }
    std::cerr << "whittle " << c.name << ": error: LibTorch: " << msg << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "whittle " << c.name << ": error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "whittle " << c.name << ": error: " << whittle::message_of(e) << "\n";
    return 1;
  }
}

}  // namespace
