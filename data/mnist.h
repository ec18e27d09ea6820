#pragma once
// MNIST in the IDX format (LeCun et al., http://yann.lecun.com/exdb/mnist/), gzipped or raw.

#include <ATen/ATen.h>

#include <string>
#include <utility>

#include "data/dataset.h"

namespace whittle::data {

/// Reads an IDX image file: big-endian magic 0x00000803 (unsigned byte, 3 dimensions), then the
/// big-endian uint32 sizes N, rows, cols, then N·rows·cols pixel bytes, row-major. The file may be
/// gzip-compressed (as the official MNIST files) or raw.
/// Returns uint8 [N, 1, rows, cols]. Throws whittle::Error naming `path` when the file cannot be
/// read, the magic is wrong, or the file is truncated or longer than its header says.
at::Tensor read_idx_images(const std::string& path);

/// Reads an IDX label file: big-endian magic 0x00000801 (unsigned byte, 1 dimension), the uint32
/// count N, then N label bytes; gzipped or raw. Returns int64 [N]. Throws whittle::Error naming
/// `path` as read_idx_images does.
at::Tensor read_idx_labels(const std::string& path);

/// Reads an MNIST pair: images [N, 1, 28, 28] (any size the header gives), labels [N], class names
/// "0".."9". Throws whittle::Error when either file is bad, when the counts differ (naming both
/// files), or when a label is above 9 (naming the labels file and the sample index).
Dataset read_mnist(const std::string& images_path, const std::string& labels_path);

/// Reads the split `split` of an MNIST folder: "train" reads train-images-idx3-ubyte[.gz] and
/// train-labels-idx1-ubyte[.gz]; "t10k" (or "test") reads the t10k-* files. The gzipped name is
/// tried first. Throws whittle::Error for an unknown split or when the files are missing (naming
/// the paths tried).
Dataset load_mnist(const std::string& dir, const std::string& split = "train");

/// The image and label file paths load_mnist would read for (dir, split), or empty strings when
/// they do not exist. Throws whittle::Error for an unknown split.
std::pair<std::string, std::string> find_mnist_files(const std::string& dir, const std::string& split);

}  // namespace whittle::data
