// `whittle data pack SRC --to FILE.h5`: a dataset packed into one HDF5 file.

#include <boost/program_options.hpp>

#include <iostream>

#include "core/error.h"
#include "core/file_util.h"
#include "data/load.h"
#include "tools/command.h"

namespace po = boost::program_options;

namespace whittle::cli {

int run_data(const std::vector<std::string>& args) {
  po::options_description opts(
      "usage: whittle data pack SRC --to FILE.h5 [--split NAME] [--overwrite]\n\n"
      "Packs a dataset (MNIST IDX, CIFAR-10 binary, image folder) into one contiguous HDF5 file\n"
      "(images uint8 N×C×H×W, labels int64; docs/data.md).\n\n"
      "example:\n  whittle data pack data/mnist10k --split train --to mnist-train.h5\n\noptions");
  std::string action, src, to, split = "train";
  opts.add_options()("help,h", "this text")("to", po::value<std::string>(&to), "output HDF5 file")(
      "overwrite", "replace an existing --to file")(
      "split", po::value<std::string>(&split)->default_value("train"), "split to read (train, test, t10k)");
  po::variables_map vm = parse_command_line(args, opts, {{"action", &action}, {"src", &src}});
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (action != "pack") throw Error("data: unknown action '" + action + "' (only 'pack')", ErrorKind::kUsage);
  if (src.empty() || to.empty()) throw Error("data pack: needs SRC and --to FILE.h5", ErrorKind::kUsage);
  data::LoadOptions lo;
  lo.split = split;
  if (path_exists(src) && is_same_or_inside(to, src))
    throw Error("data pack: --to " + to + " is " + (is_directory(src) ? "inside the dataset folder " : "the dataset ") + src +
                    ", which it would overwrite",
                ErrorKind::kUsage);
  check_writable_file("data pack", to, "--to", vm.count("overwrite") > 0);
  data::Dataset ds = data::pack_dataset(src, to, lo);
  std::cout << "packed " << ds.size() << " images [" << ds.channels() << ", " << ds.height() << ", " << ds.width()
            << "] in " << ds.num_classes() << " classes to " << to << "\n";
  return 0;
}

}  // namespace whittle::cli
