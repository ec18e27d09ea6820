#include "core/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
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


// A 64 KiB put area in front of FileSink::write: small writes (operator<<) are gathered, large ones
// go straight through.
class FileSink::Buf : public std::streambuf {
 public:
  explicit Buf(FileSink& sink) : sink_(sink), area_(1 << 16) { setp(area_.data(), area_.data() + area_.size()); }

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n >= static_cast<std::streamsize>(area_.size()) / 2) {
      drain();
      return static_cast<std::streamsize>(sink_.write(s, static_cast<size_t>(n)));
    }
    return std::streambuf::xsputn(s, n);
  }
  int_type overflow(int_type c) override {
    drain();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override {
    drain();
    return 0;
  }

 private:
  void drain() {
    if (pptr() > pbase()) sink_.write(pbase(), static_cast<size_t>(pptr() - pbase()));
    setp(area_.data(), area_.data() + area_.size());
  }
  FileSink& sink_;
  std::vector<char> area_;
};

FileSink::FileSink(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path + ": cannot create: " + errno_text());
}

FileSink::~FileSink() {
  if (fd_ >= 0) ::close(fd_);
}

size_t FileSink::write(const void* data, size_t n) noexcept {
  const char* p = static_cast<const char*>(data);
  size_t left = n;
  while (error_ == 0 && left > 0 && fd_ >= 0) {
    const ssize_t w = ::write(fd_, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      error_ = errno;
    } else if (w == 0) {
      error_ = ENOSPC;
    } else {
      p += w;
      left -= static_cast<size_t>(w);
    }
  }
  return n;
}

std::ostream& FileSink::stream() {
  if (!stream_) {
    buf_ = std::make_unique<Buf>(*this);
    stream_ = std::make_unique<std::ostream>(buf_.get());
  }
  return *stream_;
}

void FileSink::close() {
  if (stream_) stream_->flush();
  if (fd_ >= 0) {
    if (error_ == 0 && ::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) error_ = errno;
    if (::close(fd_) != 0 && error_ == 0) error_ = errno;
    fd_ = -1;
  }
  if (error_ != 0) throw Error(path_ + ": " + std::strerror(error_));
}

bool nearly_full(const std::string& path, uint64_t bytes) {
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) != 0) return false;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < bytes;
}

namespace {
// "dir/name" → "dir/.name.tmp-<pid>-<n>": hidden, and recognisable by remove_stale_temporaries.
std::string temporary_path(const std::string& path, uint64_t n) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "." + name + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(n);
}
}  // namespace

int remove_stale_temporaries(const std::string& dir) {
  int removed = 0;
  std::vector<std::string> names;
  try {
    names = list_directory(dir);
  } catch (const Error&) {
    return 0;
  }
  for (const std::string& name : names) {
    // .<name>.tmp-<pid>-<n>
    const size_t at = name.rfind(".tmp-");
    if (name.size() < 2 || name[0] != '.' || at == std::string::npos || at < 2) continue;
    const std::string tail = name.substr(at + 5);
    const size_t dash = tail.find('-');
    if (dash == std::string::npos || dash == 0 || dash + 1 == tail.size() ||
        tail.find_first_not_of("0123456789-") != std::string::npos || tail.find('-', dash + 1) != std::string::npos)
      continue;
    const long pid = std::strtol(tail.substr(0, dash).c_str(), nullptr, 10);
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;  // its writer still runs
    const std::string full = join_path(dir, name);
    if (!is_regular_file(full)) continue;
    remove_file(full);
    ++removed;
  }
  return removed;
}

void write_atomic(const std::string& path, const std::function<void(const std::string& tmp_path)>& write) {
  // rename(2) would replace whatever `path` is: a device node (/dev/null), a FIFO, a socket. Only a
  // regular file (or a symlink to one) is ever replaced; anything else is refused before writing.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw Error("cannot write " + path + ": it exists and is " + describe_path(path) +
                ", not a regular file (whittle only replaces regular files)");
  const std::string parent = parent_directory(path);
  if (!parent.empty() && !is_directory(parent))
    throw Error("cannot write " + path + ": the folder " + parent + " is " + describe_path(parent));
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = temporary_path(path, counter++);
  try {
    write(tmp);
    if (!is_regular_file(tmp)) throw Error("cannot write " + path + ": nothing was written");
    sync_path(tmp);
    rename_path(tmp, path);
  } catch (const std::exception& e) {
    // Told before the temporary goes: with it removed the file system has room again.
    std::string msg = e.what();
    if (msg.rfind(tmp + ": ", 0) == 0) msg = msg.substr(tmp.size() + 2);  // the temporary's name says nothing
    // Only for a failure that says no cause of its own (HDF5's "flush failed"): one that does (a quota,
    // a permission) is not blamed on the space left.
    const bool says_why = msg.find(std::strerror(ENOSPC)) != std::string::npos ||
                          msg.find(std::strerror(EDQUOT)) != std::string::npos ||
                          msg.find(std::strerror(EACCES)) != std::string::npos ||
                          msg.find(std::strerror(EIO)) != std::string::npos;
    const bool full = !says_why && nearly_full(parent.empty() ? "." : parent);
    remove_file(tmp);
    if (full) msg += " (no space left on device: the file system holding " + (parent.empty() ? std::string(".") : parent) + " is full)";
    const auto* error = dynamic_cast<const Error*>(&e);
    const ErrorKind kind = error ? error->kind() : ErrorKind::kRuntime;
    if (msg.find(path) != std::string::npos) {
      if (error && !full) throw;  // already names the file; keeps its type
      throw Error(msg, kind);
    }
    throw Error("cannot write " + path + ": " + msg, kind);
  }
  sync_path(parent_directory(path));
}

std::string write_failure_reason(const std::string& message, const std::string& path) {
  const std::string prefix = "cannot write " + path + ": ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

void write_file_atomic(const std::string& path, const std::string& content) {
  write_atomic(path, [&](const std::string& tmp) {
    FileSink f(tmp);
    f.write(content.data(), content.size());
    f.close();
  });
}

std::string describe_path(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return ::lstat(path.c_str(), &st) == 0 ? "a dangling symlink" : "missing";
    return std::string("unreadable (") + std::strerror(errno) + ")";
  }
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISREG(st.st_mode)) return st.st_size == 0 ? "an empty file" : "a file of " + std::to_string(st.st_size) + " bytes";
  return "not a regular file";
}

void check_directory_creatable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw Error(path + " is " + describe_path(path) + ", not a directory");
    if (::access(path.c_str(), W_OK | X_OK) != 0) throw Error(path + ": " + std::strerror(errno));
    return;
  }
  // The nearest existing ancestor must be a directory we may create entries in.
  std::string p = path;
  while (!p.empty() && p.back() == '/') p.pop_back();
  for (;;) {
    const size_t slash = p.rfind('/');
    p = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
    if (::stat(p.c_str(), &st) == 0) break;
    if (p == "." || p == "/") throw Error("cannot create " + path + ": no existing parent folder");
  }
  if (!S_ISDIR(st.st_mode)) throw Error("cannot create " + path + ": " + p + " is " + describe_path(p) + ", not a folder");
  if (::access(p.c_str(), W_OK | X_OK) != 0)
    throw Error("cannot create " + path + " in " + p + ": " + std::strerror(errno));
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) : path_(join_path(dir, ".whittle.lock")) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot lock " + dir + ": " + path_ + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char buf[64] = {};
      const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
      ::close(fd_);
      fd_ = -1;
      std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      if (err == EWOULDBLOCK)
        throw Error(dir + " is in use by another " + what + (holder.empty() ? "" : " (pid " + holder + ")") +
                    "; wait for it to finish or choose another directory");
      throw Error("cannot lock " + dir + ": " + std::strerror(err));
    }
    // The previous holder may have unlinked the file between our open and flock: then the lock
    // is on a removed file and means nothing; take the new one.
    struct stat held {}, now {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  throw Error("cannot lock " + dir + ": " + path_ + " keeps being replaced");
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still held, so that no one locks the file being removed
  ::close(fd_);
}

std::string resolved_path(const std::string& path) {
  std::string head = path.empty() ? "." : path;
  std::vector<std::string> rest;  // trailing components that do not exist, innermost first
  char buf[PATH_MAX];
  while (!::realpath(head.c_str(), buf)) {
    const size_t slash = head.find_last_of('/');
    if (slash == std::string::npos) {
      rest.push_back(head);
      head = ".";
    } else {
      rest.push_back(head.substr(slash + 1));
      head = slash == 0 ? "/" : head.substr(0, slash);
    }
  }
  std::string out = buf;
  for (auto it = rest.rbegin(); it != rest.rend(); ++it)
    if (!it->empty() && *it != ".") out = join_path(out, *it);
  return out;
}

bool is_same_or_inside(const std::string& path, const std::string& root) {
  const std::string p = resolved_path(path), r = resolved_path(root);
  return p == r || (p.size() > r.size() && p.compare(0, r.size(), r) == 0 && (r == "/" || p[r.size()] == '/'));
}

}  // namespace whittle
