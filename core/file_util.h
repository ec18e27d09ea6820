#pragma once
// Small POSIX file-system helpers.
//
// whittle does not use std::filesystem: the LibTorch wheels export their own copies of some
// std::filesystem symbols, which then interpose on libstdc++'s and crash (remove_all seen here).

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
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
/// The one way whittle writes a file: `write` fills a temporary file beside `path`, hidden
/// (`.<name>.tmp-<pid>-<n>`; the argument of `write` is its path), which is then flushed to disk (fsync), renamed over `path`, and the
/// directory entry synced, so readers and a crash at any moment see either the old file or the
/// whole new one. If `write` throws, or any step fails, the temporary is removed and `path` is left
/// as it was; the error is a whittle::Error naming `path` ("cannot write PATH: why"), or what
/// `write` threw when that already is one naming it. A `path` that exists and is not a regular
/// file (or a symlink to one) — a directory, a device node such as /dev/null, a FIFO, a socket —
/// is refused before anything is written.
void write_atomic(const std::string& path, const std::function<void(const std::string& tmp_path)>& write);
/// A file written through a sink that never fails mid-stream: `write` records the first error of
/// write(2) (ENOSPC, EDQUOT, EIO, ...), stops writing and still reports the whole length as written,
/// so that a serializer that cannot handle a short write (LibTorch's zip writer throws from its
/// destructor, which terminates the process) finishes normally; `close` then throws whittle::Error
/// naming the path and the error ("No space left on device"). Creates or truncates `path` (mode 0644).
/// Use it inside write_atomic's callback, with the temporary's path.
class FileSink {
 public:
  /// Throws whittle::Error naming `path` when it cannot be created.
  explicit FileSink(const std::string& path);
  ~FileSink();
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;
  /// Appends `n` bytes; returns `n` even after an error (see the class comment). Never throws.
  size_t write(const void* data, size_t n) noexcept;
  /// A std::ostream over `write`, for serializers that take a stream.
  std::ostream& stream();
  /// Closes the file; throws whittle::Error "PATH: <strerror>" when any write or the close failed.
  void close();

 private:
  class Buf;
  std::string path_;
  int fd_ = -1;
  int error_ = 0;
  std::unique_ptr<Buf> buf_;
  std::unique_ptr<std::ostream> stream_;
};
/// True when the file system holding `path` has less than `bytes` free for unprivileged writers
/// (statvfs(3)); false when that cannot be told.
bool nearly_full(const std::string& path, uint64_t bytes = 64 * 1024);
/// Removes the temporaries that write_atomic left in `dir` when its process was killed before the
/// rename (`.<name>.tmp-<pid>-<n>` whose process no longer runs); the files they would have
/// replaced are whole. Returns how many were removed; never throws.
int remove_stale_temporaries(const std::string& dir);
/// The reason in a write_atomic error `message` for `path`: without its "cannot write PATH: "
/// prefix, for a caller that words the failure its own way ("cannot write checkpoint PATH: why").
std::string write_failure_reason(const std::string& message, const std::string& path);
/// write_atomic with `content` as the file's bytes.
void write_file_atomic(const std::string& path, const std::string& content);
/// True when `path` starts with the HDF5 signature (at offset 0, 512, 1024, 2048, ... where the
/// HDF5 format allows a user block before it); false for unreadable or missing files.
bool is_hdf5_file(const std::string& path);
/// fsync(2) of a file or directory; best effort (errors are ignored: some file systems refuse it).
void sync_path(const std::string& path) noexcept;
/// `path` made absolute with symlinks resolved (realpath(3)) as far as it exists, the rest
/// appended as given; for comparing an output path with an input one.
std::string resolved_path(const std::string& path);
/// True when `path` is `root` or lies inside the directory `root` (both resolved).
bool is_same_or_inside(const std::string& path, const std::string& root);
/// What `path` is, for messages: "missing", "a directory", "a character device", "a FIFO",
/// "a socket", "an empty file", "a file of N bytes", "a dangling symlink".
std::string describe_path(const std::string& path);
/// Checks, creating nothing, that `path` is a writable directory or could be created as one (its
/// nearest existing ancestor is a writable directory). Throws whittle::Error saying why not.
void check_directory_creatable(const std::string& path);

/// An exclusive lock on directory `dir` held by this process: flock(2) on `<dir>/.whittle.lock`,
/// which holds the holder's pid and is removed on release. Advisory: it keeps out other processes
/// that take the same lock (two `whittle run` into one run directory), nothing else.
class DirectoryLock {
 public:
  /// Takes the lock without waiting. Throws whittle::Error "<dir> is in use by another <what> (pid
  /// N)..." when another process holds it, or naming the lock file when it cannot be created.
  DirectoryLock(const std::string& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace whittle
