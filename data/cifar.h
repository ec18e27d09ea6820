#pragma once
// CIFAR-10 in its binary version (Krizhevsky, 2009; https://www.cs.toronto.edu/~kriz/cifar.html).

#include <string>
#include <vector>

#include "data/dataset.h"

namespace whittle::data {

/// The CIFAR-10 class names, in label order: airplane automobile bird cat deer dog frog horse
/// ship truck.
const std::vector<std::string>& cifar10_class_names();

/// Reads CIFAR-10 binary batch files and concatenates them in the order given. Each file is a
/// sequence of 3073-byte records: 1 label byte (0..9) then 3072 pixel bytes, the 1024 red, then
/// 1024 green, then 1024 blue values of a 32×32 image in row-major order.
/// Returns images uint8 [N, 3, 32, 32], labels int64 [N], the CIFAR-10 class names.
/// Throws whittle::Error naming the file when it cannot be read, is empty, is not a whole number of
/// records (truncated), or holds a label above 9 (with the record index).
Dataset read_cifar10(const std::vector<std::string>& batch_files);

/// Reads a split of a CIFAR-10 binary folder (the extracted cifar-10-batches-bin, or a folder
/// holding it): "train" reads data_batch_1.bin .. data_batch_5.bin, "test" reads test_batch.bin.
/// Throws whittle::Error for an unknown split or a missing file (naming it).
Dataset load_cifar10(const std::string& dir, const std::string& split = "train");

/// The folder holding the CIFAR-10 batch files: `dir` itself when it holds data_batch_1.bin or
/// test_batch.bin, else dir/cifar-10-batches-bin when that does; empty when neither.
std::string find_cifar10_dir(const std::string& dir);

}  // namespace whittle::data
