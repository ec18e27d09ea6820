#include "data/load.h"

#include <zlib.h>

#include <memory>

#include "data/cifar.h"
#include "data/image_archive.h"
#include "data/image_folder.h"
#include "data/io_util.h"
#include "core/file_util.h"
#include "data/mnist.h"
#include "core/error.h"

namespace whittle::data {
namespace {

// The first 4 bytes of a (possibly gzipped) file, or 0 when it is shorter.
uint32_t peek_magic(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return 0;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> guard(f, &gzclose);
  uint8_t buf[4];
  if (gzread(f, buf, 4) != 4) return 0;
  return detail::load_be32(buf);
}

bool has_subfolders(const std::string& dir) {
  for (const std::string& name : list_directory(dir))
    if (name[0] != '.' && is_directory(join_path(dir, name))) return true;
  return false;
}

std::string labels_path_for(const std::string& images_path) {
  const std::string key = "images-idx3";
  const size_t slash = images_path.find_last_of('/');
  const size_t pos = images_path.rfind(key);
  if (pos == std::string::npos || (slash != std::string::npos && pos < slash)) return {};
  std::string labels = images_path;
  labels.replace(pos, key.size(), "labels-idx1");
  return labels;
}

}  // namespace

std::string to_string(DatasetFormat format) {
  switch (format) {
    case DatasetFormat::kMnistIdx: return "mnist-idx";
    case DatasetFormat::kCifar10Binary: return "cifar10-binary";
    case DatasetFormat::kImageFolder: return "image-folder";
    case DatasetFormat::kImageArchive: return "image-archive";
    case DatasetFormat::kHdf5: return "hdf5";
  }
  return "unknown";
}

DatasetFormat detect_format(const std::string& path, const LoadOptions& options, std::string* resolved) {
  auto set = [&](const std::string& p) {
    if (resolved) *resolved = p;
  };
  if (is_regular_file(path)) {
    set(path);
    if (is_hdf5_file(path)) return DatasetFormat::kHdf5;
    if (is_image_archive(path)) return DatasetFormat::kImageArchive;
    const uint32_t magic = peek_magic(path);
    if (magic == 0x00000803u) return DatasetFormat::kMnistIdx;
    if (magic == 0x00000801u)
      throw Error(path + ": is an IDX labels file; give the images file (…-images-idx3-ubyte) or its folder");
    const int64_t size = detail::file_size(path);
    if (size > 0 && size % 3073 == 0) return DatasetFormat::kCifar10Binary;
    throw Error(path + ": unrecognised dataset file (expected HDF5, an MNIST IDX images file, a CIFAR-10 "
                       "binary batch of 3073-byte records, or an image-folder archive .tar/.tar.gz/.tgz)");
  }
  if (!is_directory(path)) {
    if (!path_exists(path)) throw Error(path + ": no such file or folder");
    throw Error(path + ": is " + describe_path(path) + ", not a dataset file or folder");
  }
  if (!find_mnist_files(path, "train").first.empty() || !find_mnist_files(path, "t10k").first.empty()) {
    set(path);
    return DatasetFormat::kMnistIdx;
  }
  const std::string cifar = find_cifar10_dir(path);
  if (!cifar.empty()) {
    set(cifar);
    return DatasetFormat::kCifar10Binary;
  }
  const std::string split_dir = join_path(path, options.split);
  if (!options.split.empty() && is_directory(split_dir) && has_subfolders(split_dir)) {
    set(split_dir);
    return DatasetFormat::kImageFolder;
  }
  if (has_subfolders(path)) {
    set(path);
    return DatasetFormat::kImageFolder;
  }
  throw Error(path + ": unrecognised dataset folder (expected MNIST IDX files, CIFAR-10 binary batches, or an "
                     "image folder root/<class>/<image>)");
}

namespace {

Dataset load_any(const std::string& path, const std::string& target, DatasetFormat format, const LoadOptions& options) {
  switch (format) {
    case DatasetFormat::kHdf5: return read_hdf5_dataset(target);
    case DatasetFormat::kMnistIdx: {
      if (is_regular_file(target)) {
        const std::string labels = labels_path_for(target);
        if (labels.empty() || !is_regular_file(labels))
          throw Error(target + ": cannot find the matching labels file (expected the name with labels-idx1 in "
                               "place of images-idx3" +
                      (labels.empty() ? std::string() : ": " + labels) + ")");
        return read_mnist(target, labels);
      }
      return load_mnist(target, options.split);
    }
    case DatasetFormat::kCifar10Binary:
      return is_regular_file(target) ? read_cifar10({target}) : load_cifar10(target, options.split);
    case DatasetFormat::kImageFolder:
    case DatasetFormat::kImageArchive: {
      ImageFolderOptions o;
      o.channels = options.channels;
      o.num_threads = options.num_threads;
      return format == DatasetFormat::kImageFolder ? read_image_folder(target, o)
                                                   : read_image_archive(target, options.split, o);
    }
  }
  throw Error(path + ": unsupported dataset format");
}

}  // namespace

Dataset load_dataset(const std::string& path, const LoadOptions& options) {
  std::string target;
  const DatasetFormat format = detect_format(path, options, &target);
  Dataset d = load_any(path, target, format, options);
  if (d.size() == 0)
    throw Error(target + ": the " + to_string(format) + " dataset" +
                (format == DatasetFormat::kHdf5 ? std::string() : " (split " + options.split + ")") + " holds no images");
  return d;
}

Dataset pack_dataset(const std::string& source, const std::string& destination, const LoadOptions& options,
                     const Hdf5WriteOptions& write_options) {
  Dataset d = load_dataset(source, options);
  write_hdf5_dataset(d, destination, write_options);
  return d;
}

}  // namespace whittle::data
