#pragma once
// Small POSIX file-system helpers.
//
// whittle does not use std::filesystem: the LibTorch wheels export their own copies of some
// std::filesystem symbols, which then interpose on libstdc++'s and crash (remove_all seen here).

#include <string>
#include <vector>

namespace whittle {

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
bool is_regular_file(const std::string& path);
/// Size in bytes; throws whittle::Error naming the path when it cannot be read.
int64_t file_size(const std::string& path);
/// Creates `path` and its missing parents (mode 0755); throws whittle::Error naming the path.
void make_directories(const std::string& path);
/// Removes a file if it exists; never throws.
void remove_file(const std::string& path) noexcept;
/// Removes a directory tree (or a file) if it exists; throws whittle::Error on failure.
void remove_tree(const std::string& path);
/// rename(2): atomic within one file system; throws whittle::Error naming both paths.
void rename_path(const std::string& from, const std::string& to);
/// Entry names of a directory (no "." and ".."), sorted; throws whittle::Error naming the path.
std::vector<std::string> list_directory(const std::string& path);
/// "a/b/c.h5" → "a/b"; "c.h5" → ".".
std::string parent_directory(const std::string& path);
/// "a" + "b" → "a/b".
std::string join_path(const std::string& a, const std::string& b);
/// Lower-case extension with the dot (".jpg"), or "".
std::string file_extension(const std::string& path);
/// Whole file as bytes; throws whittle::Error naming the path.
std::string read_file(const std::string& path);
/// Writes `content` to a temporary file beside `path`, then renames it over `path`, so readers
/// never see a partial file; throws whittle::Error naming the path (the temporary is removed).
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace whittle
