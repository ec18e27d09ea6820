#include "core/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace whittle {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": " + errno_text());
  return static_cast<int64_t>(st.st_size);
}

void make_directories(const std::string& path) {
  if (path.empty() || is_directory(path)) return;
  const std::string parent = parent_directory(path);
  if (parent != path && parent != "." && parent != "/") make_directories(parent);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    throw Error("cannot create directory " + path + ": " + errno_text());
  if (!is_directory(path)) throw Error("cannot create directory " + path + ": a file of that name exists");
}

void remove_file(const std::string& path) noexcept { ::unlink(path.c_str()); }

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const auto& name : list_directory(path)) remove_tree(join_path(path, name));
    if (::rmdir(path.c_str()) != 0) throw Error("cannot remove directory " + path + ": " + errno_text());
  } else if (::unlink(path.c_str()) != 0) {
    throw Error("cannot remove " + path + ": " + errno_text());
  }
}

void rename_path(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) throw Error("cannot rename " + from + " to " + to + ": " + errno_text());
}

std::vector<std::string> list_directory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (!dir) throw Error("cannot list directory " + path + ": " + errno_text());
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

std::string parent_directory(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty() || (!b.empty() && b.front() == '/')) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

std::string file_extension(const std::string& path) {
  size_t slash = path.rfind('/');
  size_t dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

std::string read_file(const std::string& path) {
  if (!path_exists(path)) throw Error(path + ": no such file");
  if (is_directory(path)) throw Error(path + ": is a directory, expected a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open for reading: " + errno_text());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool is_hdf5_file(const std::string& path) {
  static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  for (std::streamoff offset = 0; offset + 8 <= size; offset = offset == 0 ? 512 : offset * 2) {
    char buf[8];
    in.seekg(offset);
    if (!in.read(buf, 8)) return false;
    if (std::memcmp(buf, kSignature, 8) == 0) return true;
  }
  return false;
}

void sync_path(const std::string& path) noexcept {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

void write_atomic(const std::string& path, const std::function<void(const std::string& tmp_path)>& write) {
  // rename(2) would replace whatever `path` is: a device node (/dev/null), a FIFO, a socket. Only a
  // regular file (or a symlink to one) is ever replaced; anything else is refused before writing.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const char* what = S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                       : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket" : "not a regular file";
    throw Error("cannot write " + path + ": it exists and is " + std::string(what) +
                ", not a regular file (whittle only replaces regular files)");
  }
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  try {
    write(tmp);
    if (!is_regular_file(tmp)) throw Error("cannot write " + path + ": nothing was written");
    sync_path(tmp);
    rename_path(tmp, path);
  } catch (const Error& e) {
    remove_file(tmp);
    const std::string msg = e.what();
    if (msg.find(path) != std::string::npos) throw;
    throw Error("cannot write " + path + ": " + msg, e.kind());
  } catch (const std::exception& e) {
    remove_file(tmp);
    throw Error("cannot write " + path + ": " + e.what());
  }
  sync_path(parent_directory(path));
}

void write_file_atomic(const std::string& path, const std::string& content) {
  write_atomic(path, [&](const std::string& tmp) {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error("cannot write " + path + ": " + errno_text());
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
    f.flush();
    if (!f) throw Error("cannot write " + path + ": write failed (disk full?)");
  });
}

}  // namespace whittle
