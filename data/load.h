#pragma once
// One entry point for every dataset format: load_dataset (auto-detecting) and pack_dataset
// (convert any supported source into whittle's HDF5 layout, `whittle data pack SRC --to FILE.h5`).

#include <string>

#include "data/dataset.h"
#include "data/hdf5_dataset.h"

namespace whittle::data {

/// The dataset formats whittle reads (docs/data.md).
enum class DatasetFormat { kMnistIdx, kCifar10Binary, kImageFolder, kImageArchive, kHdf5 };

/// "mnist-idx", "cifar10-binary", "image-folder", "image-archive" or "hdf5".
std::string to_string(DatasetFormat format);

/// Options of load_dataset and pack_dataset.
struct LoadOptions {
  /// The split to read from a folder or archive holding several: "train" or "test" ("t10k" is accepted
  /// for MNIST). Single files (HDF5, one IDX or CIFAR file) ignore it.
  std::string split = "train";
  /// Image folders and archives only: 0 = channels as stored, 1 = gray, 3 = RGB (see ImageFolderOptions).
  int64_t channels = 0;
  /// Image folders and archives only: decoding threads, 0 = all cores.
  int num_threads = 0;
};

/// Works out the format of `path` and the file or folder to read, without reading the images:
/// - a file with the HDF5 signature: kHdf5;
/// - a file named .tar, .tar.gz or .tgz: kImageArchive (image folders inside a tar archive,
///   [<prefix>/]<split>/<class>/<image>, read without extracting; see data/image_archive.h);
/// - an IDX file with magic 0x00000803 (gzipped or raw): kMnistIdx, labels from the file named
///   with "labels-idx1" in place of "images-idx3";
/// - a file whose size is a whole number of 3073-byte records: kCifar10Binary (one batch);
/// - a folder holding <split>-images-idx3-ubyte[.gz] (train or t10k): kMnistIdx;
/// - a folder holding data_batch_1.bin or test_batch.bin (itself or in cifar-10-batches-bin):
///   kCifar10Binary;
/// - a folder with a subfolder named `split` that holds class folders (root/train/<class>/…):
///   kImageFolder rooted there; any other folder with subfolders: kImageFolder rooted at `path`.
/// `resolved` receives the file or folder that will be read. Throws whittle::Error naming `path`
/// when it does not exist or matches none of these.
DatasetFormat detect_format(const std::string& path, const LoadOptions& options, std::string* resolved = nullptr);

/// Loads the dataset at `path` in whatever supported format it is (see detect_format): MNIST IDX,
/// CIFAR-10 binary, an image folder or a tar archive of one, or whittle's HDF5 layout. Returns images uint8 [N, C, H, W],
/// labels int64 [N] and the class names. Throws whittle::Error from detection or the reader, and
/// for a dataset that holds no images.
Dataset load_dataset(const std::string& path, const LoadOptions& options = {});

/// Loads `source` (any format load_dataset reads) and writes it to `destination` in whittle's
/// HDF5 layout (atomically, see write_hdf5_dataset). Returns the dataset written. Throws
/// whittle::Error from loading or writing; `destination` is untouched on error.
Dataset pack_dataset(const std::string& source, const std::string& destination, const LoadOptions& options = {},
                     const Hdf5WriteOptions& write_options = {});

}  // namespace whittle::data
