#pragma once
// Datasets in HDF5 files (layout in docs/data.md): read, write (atomically), and recognise.

#include <string>

#include "core/file_util.h"  // is_hdf5_file

#include "data/dataset.h"

namespace whittle::data {

/// Options of write_hdf5_dataset.
struct Hdf5WriteOptions {
  /// gzip (deflate) level 1..9 for `images` and `labels`, stored in chunks of whole images;
  /// 0 = uncompressed, contiguous (the fastest to read).
  int compression = 0;
};

/// Reads a dataset file in whittle's HDF5 layout (docs/data.md):
/// - `/images`: uint8 [N, C, H, W] (C = 1 or 3);
/// - `/labels`: any integer type, [N], returned as int64;
/// - class names, optional: the root attribute `class_names`, or else a dataset `/class_names`,
///   a 1-D array of strings (variable or fixed length).
/// Files written by h5py with that layout read the same; the root attributes `format` and
/// `format_version` are optional, and a format_version above 1 is refused. Throws whittle::Error naming `path` and
/// the offending object when the file is missing, is not HDF5 or is truncated, a dataset is
/// missing or has the wrong type or rank, the counts differ, or a label is out of range.
Dataset read_hdf5_dataset(const std::string& path);

/// Writes `dataset` in whittle's HDF5 layout: `/images` uint8 [N, C, H, W], `/labels` int64 [N],
/// root attributes `class_names` (variable-length UTF-8 strings, when the dataset has names),
/// `format` = "whittle.dataset" and `format_version` = 1. The file is written under a temporary name in
/// the same folder, flushed to disk, then renamed over `path`, so a crash never leaves a
/// half-written file at `path`. Throws whittle::Error naming `path` when the dataset is invalid
/// (see Dataset::validate) or holds no images, or the file cannot be written; the temporary file is removed then.
void write_hdf5_dataset(const Dataset& dataset, const std::string& path, const Hdf5WriteOptions& options = {});


}  // namespace whittle::data
