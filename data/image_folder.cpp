#include "data/image_folder.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>

#include "data/image_decode.h"
#include "data/io_util.h"
#include "core/file_util.h"
#include "core/error.h"

namespace whittle::data {
namespace {

bool is_image_name(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  auto ends = [&](const std::string& ext) {
    return lower.size() > ext.size() && lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0;
  };
  return ends(".jpg") || ends(".jpeg") || ends(".png");
}

std::string size_text(int64_t w, int64_t h) { return std::to_string(w) + "x" + std::to_string(h); }

// Lists root/<class>/<file>: entries with full paths, and each entry's bare file name.
std::vector<ImageFolderEntry> list_folder(const std::string& root, std::vector<std::string>& class_names,
                                          std::vector<std::string>& file_names) {
  if (!is_directory(root)) throw Error(root + ": not a folder (expected an image folder root/<class>/<image>)");
  class_names.clear();
  file_names.clear();
  for (const detail::DirEntry& e : detail::list_dir_typed(root))
    if (e.is_dir && e.name[0] != '.') class_names.push_back(e.name);
  if (class_names.empty()) throw Error(root + ": image folder has no class subfolders (expected root/<class>/<image>)");
  std::sort(class_names.begin(), class_names.end());
  std::vector<ImageFolderEntry> entries;
  for (size_t c = 0; c < class_names.size(); ++c) {
    const std::string dir = join_path(root, class_names[c]);
    std::vector<std::string> files;
    for (const detail::DirEntry& e : detail::list_dir_typed(dir))
      if (e.is_file && is_image_name(e.name)) files.push_back(e.name);
    std::sort(files.begin(), files.end());
    for (std::string& f : files) {
      entries.push_back({join_path(dir, f), static_cast<int64_t>(c)});
      file_names.push_back(std::move(f));
    }
  }
  return entries;
}

}  // namespace

std::vector<ImageFolderEntry> list_image_folder(const std::string& root, std::vector<std::string>& class_names) {
  std::vector<std::string> file_names;
  return list_folder(root, class_names, file_names);
}

Dataset read_image_folder(const std::string& root, const ImageFolderOptions& options) {
  Dataset d;
  std::vector<std::string> file_names;
  std::vector<ImageFolderEntry> entries = list_folder(root, d.class_names, file_names);
  if (entries.empty()) throw Error(root + ": image folder holds no .jpg, .jpeg or .png files");
  if (options.channels != 0 && options.channels != 1 && options.channels != 3)
    throw Error(root + ": channels must be 0 (as stored), 1 or 3, got " + std::to_string(options.channels));
  const auto n = static_cast<int64_t>(entries.size());

  // The first image fixes the size (and the channels unless given).
  ImageDecoder first_decoder;
  const std::vector<uint8_t> first_bytes = detail::read_file(entries[0].path);
  const ImageHeader first = first_decoder.header(first_bytes.data(), first_bytes.size(), entries[0].path);
  const int64_t c = options.channels == 0 ? first.channels : options.channels;
  d.images = at::empty({n, c, first.height, first.width}, at::kByte);
  d.labels = at::empty({n}, at::kLong);
  uint8_t* images = d.images.data_ptr<uint8_t>();
  int64_t* labels = d.labels.data_ptr<int64_t>();
  const int64_t image_bytes = c * first.height * first.width;

  // Files are opened relative to their class folder (openat), sparing a path walk per file.
  std::vector<int> dir_fds;
  struct FdCloser {
    std::vector<int>& fds;
    ~FdCloser() {
      for (int fd : fds) ::close(fd);
    }
  } closer{dir_fds};
  for (const std::string& name : d.class_names) {
    const std::string dir = join_path(root, name);
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw Error(dir + ": cannot open folder (" + std::strerror(errno) + ")");
    dir_fds.push_back(fd);
  }

  // Workers claim samples one at a time. On a failure, samples after the lowest failing index
  // are skipped, and the failure with the lowest index is reported, whatever the thread timing.
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
  std::mutex error_mutex;
  std::string error_message;
  auto work = [&]() {
    ImageDecoder decoder;
    std::vector<uint8_t> bytes;
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      if (i > first_bad.load()) continue;
      const ImageFolderEntry& e = entries[static_cast<size_t>(i)];
      labels[i] = e.label;
      try {
        if (int err = detail::read_file_at(dir_fds[static_cast<size_t>(e.label)], file_names[static_cast<size_t>(i)].c_str(), bytes))
          throw Error(e.path + ": cannot read (" + std::strerror(err) + ")");
        const ImageHeader h = decoder.header(bytes.data(), bytes.size(), e.path);
        if (h.width != first.width || h.height != first.height)
          throw Error(e.path + ": image is " + size_text(h.width, h.height) + " (width x height), expected " +
                      size_text(first.width, first.height) + " like " + entries[0].path +
                      " (all images of an image folder must share one size)");
        decoder.decode(bytes.data(), bytes.size(), h, c, images + i * image_bytes, e.path);
      } catch (const std::exception& ex) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (i < first_bad.load()) {
          first_bad.store(i);
          error_message = ex.what();
        }
      }
    }
  };
  int threads = options.num_threads > 0 ? options.num_threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, std::min<int>(threads, static_cast<int>(std::min<int64_t>(n, 256))));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (first_bad.load() != std::numeric_limits<int64_t>::max()) throw Error(error_message);
  return d;
}

}  // namespace whittle::data
