#include "data/io_util.h"

#include <dirent.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "graph/error.h"

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
      throw Error(path + ": corrupt gzip data (" + (msg ? msg : "unknown error") + ")");
    }
    bytes.resize(old + static_cast<size_t>(got));
    if (got == 0) break;
  }
  int code = Z_OK;
  const char* msg = gzerror(f, &code);
  if (code != Z_OK)
    throw Error(path + ": truncated or corrupt gzip data (" + (msg ? msg : "unknown error") + ")");
  return bytes;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size);
}

std::vector<std::string> list_dir(const std::string& path) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(path.c_str()), &::closedir);
  if (!dir) throw Error(path + ": cannot list folder (" + std::strerror(errno) + ")");
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(dir.get())) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  if (errno != 0) throw Error(path + ": cannot list folder (" + std::strerror(errno) + ")");
  return names;
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

}  // namespace whittle::data::detail
