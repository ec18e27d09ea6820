#include "data/cifar.h"

#include <cstring>

#include "data/io_util.h"
#include "core/file_util.h"
#include "core/error.h"

namespace whittle::data {
namespace {
constexpr int64_t kPixels = 3 * 32 * 32;
constexpr int64_t kRecord = 1 + kPixels;
}  // namespace

const std::vector<std::string>& cifar10_class_names() {
  static const std::vector<std::string> names = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                 "dog",      "frog",       "horse", "ship", "truck"};
  return names;
}

Dataset read_cifar10(const std::vector<std::string>& batch_files) {
  if (batch_files.empty()) throw Error("read_cifar10: no batch files given");
  std::vector<std::vector<uint8_t>> contents;
  int64_t total = 0;
  for (const std::string& path : batch_files) {
    contents.push_back(detail::read_file(path));
    const auto size = static_cast<int64_t>(contents.back().size());
    if (size == 0) throw Error(path + ": empty file, expected CIFAR-10 records of 3073 bytes");
    if (size % kRecord != 0)
      throw Error(path + ": truncated or not a CIFAR-10 binary batch: " + std::to_string(size) +
                  " bytes is not a whole number of 3073-byte records (" + std::to_string(size / kRecord) +
                  " records and " + std::to_string(size % kRecord) + " bytes left over)");
    total += size / kRecord;
  }
  Dataset d;
  d.images = at::empty({total, 3, 32, 32}, at::kByte);
  d.labels = at::empty({total}, at::kLong);
  uint8_t* img = d.images.data_ptr<uint8_t>();
  int64_t* lab = d.labels.data_ptr<int64_t>();
  int64_t n = 0;
  for (size_t f = 0; f < contents.size(); ++f) {
    const std::vector<uint8_t>& bytes = contents[f];
    const auto records = static_cast<int64_t>(bytes.size()) / kRecord;
    for (int64_t r = 0; r < records; ++r, ++n) {
      const uint8_t* rec = bytes.data() + r * kRecord;
      if (rec[0] > 9)
        throw Error(batch_files[f] + ": record " + std::to_string(r) + " has label " + std::to_string(rec[0]) +
                    ", expected 0..9");
      lab[n] = rec[0];
      std::memcpy(img + n * kPixels, rec + 1, kPixels);
    }
  }
  d.class_names = cifar10_class_names();
  return d;
}

std::string find_cifar10_dir(const std::string& dir) {
  for (const std::string& d : {dir, join_path(dir, "cifar-10-batches-bin")}) {
    if (is_regular_file(join_path(d, "data_batch_1.bin")) || is_regular_file(join_path(d, "test_batch.bin")))
      return d;
  }
  return {};
}

Dataset load_cifar10(const std::string& dir, const std::string& split) {
  std::string root = find_cifar10_dir(dir);
  if (root.empty()) root = dir;
  std::vector<std::string> files;
  if (split == "train") {
    for (int k = 1; k <= 5; ++k) files.push_back(join_path(root, "data_batch_" + std::to_string(k) + ".bin"));
  } else if (split == "test") {
    files.push_back(join_path(root, "test_batch.bin"));
  } else {
    throw Error(dir + ": unknown CIFAR-10 split '" + split + "' (expected train or test)");
  }
  for (const std::string& f : files)
    if (!is_regular_file(f)) throw Error(f + ": no such file (CIFAR-10 split '" + split + "')");
  return read_cifar10(files);
}

}  // namespace whittle::data
