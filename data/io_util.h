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

// No std::filesystem here: the LibTorch wheels export their own copies of some std::filesystem
// symbols, which interpose on libstdc++'s and crash (std::filesystem::remove_all seen). These
// helpers use POSIX calls instead.

/// True when `path` names an existing regular file (after following links).
bool is_file(const std::string& path);
/// True when `path` names an existing directory (after following links).
bool is_dir(const std::string& path);
/// Size of the file in bytes, or -1 when it cannot be read.
int64_t file_size(const std::string& path);
/// Entry names of a folder (no "." and ".."), unsorted. Throws whittle::Error naming `path`.
std::vector<std::string> list_dir(const std::string& path);
/// "a/b/c.h5" → "a/b"; "c.h5" → ".".
std::string parent_dir(const std::string& path);
/// `dir` + "/" + `name` (no separator doubled).
std::string join_path(const std::string& dir, const std::string& name);

}  // namespace whittle::data::detail
