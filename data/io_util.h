#pragma once
// Internal file helpers of the data module (not installed).

#include <cstdint>
#include <string>
#include <vector>

namespace whittle::data::detail {

/// The whole file as bytes. Throws whittle::Error "<path>: cannot open (<reason>)" or a read error.
std::vector<uint8_t> read_file(const std::string& path);

/// The file's bytes, gunzipped when it is gzip-compressed (zlib's transparent gzread reads plain
/// files unchanged). Throws whittle::Error naming `path` when it cannot be opened, or when the
/// gzip stream is corrupt or truncated.
std::vector<uint8_t> read_maybe_gzip(const std::string& path);

/// Big-endian uint32 at p[0..3].
inline uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// No std::filesystem here (see core/file_util.h, which has the general path helpers).

/// Size of the file in bytes, or -1 when it cannot be read.
int64_t file_size(const std::string& path);

/// A folder entry with its type, links followed.
struct DirEntry {
  std::string name;
  bool is_dir = false;
  bool is_file = false;
};
/// Entries of a folder (no "." and ".."), unsorted, typed from readdir's d_type where the file
/// system gives it (no stat per entry), else by stat. Throws whittle::Error naming `path`.
std::vector<DirEntry> list_dir_typed(const std::string& path);

/// Reads the file `name` in the folder open as `dir_fd` (openat) into `bytes` (resized to the
/// file's size, capacity reused). Returns 0, or the errno value of the failure.
int read_file_at(int dir_fd, const char* name, std::vector<uint8_t>& bytes);

}  // namespace whittle::data::detail
