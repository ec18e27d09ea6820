#include "data/io_util.h"
#include "core/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace whittle::data::detail {

std::vector<uint8_t> read_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  std::vector<uint8_t> bytes;
  if (std::fseek(f.get(), 0, SEEK_END) == 0) {
    long size = std::ftell(f.get());
    if (size > 0) bytes.reserve(static_cast<size_t>(size));
    std::fseek(f.get(), 0, SEEK_SET);
  }
  uint8_t chunk[1 << 16];
  size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof chunk, f.get())) > 0) bytes.insert(bytes.end(), chunk, chunk + got);
  if (std::ferror(f.get())) throw Error(path + ": read error (" + std::strerror(errno) + ")");
  return bytes;
}

std::vector<uint8_t> read_maybe_gzip(const std::string& path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr)
    throw Error(path + ": cannot open (" + (errno != 0 ? std::strerror(errno) : "out of memory") + ")");
  std::unique_ptr<gzFile_s, int (*)(gzFile)> guard(f, &gzclose);
  gzbuffer(f, 1 << 17);
  std::vector<uint8_t> bytes;
  const unsigned chunk = 1u << 20;
  for (;;) {
    size_t old = bytes.size();
    bytes.resize(old + chunk);
    int got = gzread(f, bytes.data() + old, chunk);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      std::string reason = msg ? msg : "unknown error";
      if (reason.rfind(path + ": ", 0) == 0) reason.erase(0, path.size() + 2);  // zlib prefixes the path
      throw Error(path + ": corrupt gzip data (" + reason + ")");
    }
    bytes.resize(old + static_cast<size_t>(got));
    if (got == 0) break;
  }
  int code = Z_OK;
  const char* msg = gzerror(f, &code);
  if (code != Z_OK) {
    std::string reason = msg ? msg : "unknown error";
    if (reason.rfind(path + ": ", 0) == 0) reason.erase(0, path.size() + 2);  // zlib prefixes the path
    throw Error(path + ": truncated or corrupt gzip data (" + reason + ")");
  }
  return bytes;
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size);
}

std::vector<DirEntry> list_dir_typed(const std::string& path) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(path.c_str()), &::closedir);
  if (!dir) throw Error(path + ": cannot list folder (" + std::strerror(errno) + ")");
  std::vector<DirEntry> entries;
  errno = 0;
  while (const dirent* e = ::readdir(dir.get())) {
    DirEntry entry;
    entry.name = e->d_name;
    if (entry.name == "." || entry.name == "..") continue;
    if (e->d_type == DT_DIR) {
      entry.is_dir = true;
    } else if (e->d_type == DT_REG) {
      entry.is_file = true;
    } else if (e->d_type == DT_LNK || e->d_type == DT_UNKNOWN) {
      struct stat st {};
      if (::stat(whittle::join_path(path, entry.name).c_str(), &st) == 0) {
        entry.is_dir = S_ISDIR(st.st_mode);
        entry.is_file = S_ISREG(st.st_mode);
      }
    }
    entries.push_back(std::move(entry));
    errno = 0;
  }
  if (errno != 0) throw Error(path + ": cannot list folder (" + std::strerror(errno) + ")");
  return entries;
}

int read_file_at(int dir_fd, const char* name, std::vector<uint8_t>& bytes) {
  const int fd = ::openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return err;
  }
  bytes.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      return err;
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return 0;
}

}  // namespace whittle::data::detail
