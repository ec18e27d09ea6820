#pragma once
// whittle checkpoints: one HDF5 file holding a model's graph structure, every tensor by node name,
// the recipe that produced it, its metrics, and the versions that wrote it. Loading never runs
// code from the file. The layout is documented in docs/checkpoint-format.md:
//
//   /                attrs: format = "whittle.checkpoint", format_version (int),
//                           whittle_version, torch_version, created (UTC, ISO 8601)
//   /graph           uint8 [n], deflate: the graph structure (graph/serialize.h JSON)   attr crc32
//   /recipe          string: the recipe YAML (absent when none)                           attr crc32
//   /metrics         string: metrics JSON (absent when none)                              attr crc32
//   /tensors/index   uint8 [n], deflate: JSON list of {node, name, role, dtype, shape, offset,
//                    nbytes, crc32[, packed]} for every tensor                            attr crc32
//   /tensors/data    uint8 [n]: all tensors' bytes, each at its offset
// Quantized weights are stored as packed codes plus scales (quantize/quantize.h pack_graph).
// Every tensor's CRC-32 (zlib) is checked on reading, so flipped bytes are reported instead of
// silently loaded.

#include <string>
#include <vector>

#include "core/file_util.h"  // is_hdf5_file

#include "graph/graph.h"

namespace whittle {

/// The checkpoint format version this whittle writes; files with a higher version are refused.
/// Version 4: every tensor in one /tensors/data dataset described by /tensors/index; quantized
/// weights as packed codes of any width 1..8 without gaps. Version 3 is the same but for 3-bit
/// codes in 4-bit fields and 5..7-bit codes in bytes (its index says so); whittle reads it and
/// repacks. Earlier development layouts are refused with a clear error.
constexpr int kCheckpointFormatVersion = 4;
/// The oldest checkpoint format version this whittle reads.
constexpr int kCheckpointOldestReadableVersion = 3;

/// Everything a checkpoint holds.
struct Checkpoint {
  Graph graph;
  std::string recipe;   ///< recipe YAML text ("" when none)
  std::string metrics;  ///< metrics JSON text ("" when none)
  std::string whittle_version;
  std::string torch_version;
  std::string created;  ///< UTC time of writing, ISO 8601
  int format_version = kCheckpointFormatVersion;
};

/// Writes `graph` (tensors are copied to CPU) with the recipe and metrics to `path`. The file is
/// written to a temporary name in the same directory and renamed over `path` only when complete,
/// so a crash or an error never leaves a half-written checkpoint or damages an earlier one.
/// Throws whittle::Error naming the path when the directory cannot be written.
void save_checkpoint(const std::string& path, const Graph& graph, const std::string& recipe = "",
                     const std::string& metrics = "");

/// Reads a checkpoint. Checks the format marker and version, the layout, each dataset's dtype,
/// shape and CRC-32 against the graph structure before trusting it. Throws whittle::Error naming
/// the path and what is wrong for a missing, truncated, corrupted or newer-format file.
Checkpoint load_checkpoint(const std::string& path);

/// The tensors a checkpoint stores, as "node.name" in storage order (from its tensor index,
/// without loading the data). Throws whittle::Error like load_checkpoint for unreadable files.
std::vector<std::string> checkpoint_tensor_names(const std::string& path);

/// The recipe text a checkpoint stores ("" when it has none), without loading its graph or tensors.
/// Throws whittle::Error like load_checkpoint for files that are not checkpoints or are damaged.
std::string checkpoint_recipe(const std::string& path);


}  // namespace whittle
