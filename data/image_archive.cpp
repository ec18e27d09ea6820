#include "data/image_archive.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "data/image_decode.h"
#include "core/error.h"

namespace whittle::data {

namespace {

std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= p.size()) {
    size_t slash = p.find('/', start);
    std::string part = p.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (!part.empty() && part != ".") parts.push_back(part);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return parts;
}

bool has_image_extension(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto ends = [&](const char* ext) {
    const size_t n = std::strlen(ext);
    return lower.size() > n && lower.compare(lower.size() - n, n, ext) == 0;
  };
  return ends(".jpg") || ends(".jpeg") || ends(".png");
}

struct Entry {
  std::string cls, file, path;
  std::vector<uint8_t> bytes;
};

}  // namespace

bool is_image_archive(const std::string& path) {
  auto ends = [&](const char* ext) {
    const size_t n = std::strlen(ext);
    return path.size() > n && path.compare(path.size() - n, n, ext) == 0;
  };
  return ends(".tar") || ends(".tar.gz") || ends(".tgz");
}

namespace {
// libarchive's message for the last error; it may have none (found by fuzz_image_archive: a NULL
// message was appended to a std::string).
std::string archive_message(archive* a) {
  const char* m = archive_error_string(a);
  return m ? m : "unknown error (libarchive gives no message)";
}
}  // namespace

Dataset read_image_archive(const std::string& path, const std::string& split, const ImageFolderOptions& options) {
  archive* a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_tar(a);
  struct Closer {
    archive* a;
    ~Closer() { archive_read_free(a); }
  } closer{a};
  if (archive_read_open_filename(a, path.c_str(), 1 << 20) != ARCHIVE_OK)
    throw Error(path + ": cannot open archive: " + archive_message(a));
  std::vector<Entry> entries;
  std::set<std::string> splits_seen;
  archive_entry* e = nullptr;
  int rc;
  while ((rc = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
    if (archive_entry_filetype(e) != AE_IFREG) continue;
    const std::string name = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
    std::vector<std::string> parts = split_path(name);
    if (parts.size() >= 3 && has_image_extension(parts.back())) splits_seen.insert(parts[parts.size() - 3]);
    if (parts.size() < 3 || parts[parts.size() - 3] != split || !has_image_extension(parts.back())) continue;
    if (parts[parts.size() - 2].front() == '.' || parts.back().front() == '.') continue;
    const la_int64_t size = archive_entry_size(e);
    if (size < 0 || size > (int64_t{1} << 30)) throw Error(path + ": entry " + name + " has an implausible size");
    Entry en{parts[parts.size() - 2], parts.back(), name, std::vector<uint8_t>(static_cast<size_t>(size))};
    la_ssize_t got = archive_read_data(a, en.bytes.data(), en.bytes.size());
    if (got != size) throw Error(path + ": entry " + name + " is truncated (archive damaged)");
    entries.push_back(std::move(en));
  }
  if (rc != ARCHIVE_EOF) throw Error(path + ": cannot read archive: " + archive_message(a));
  if (entries.empty()) {
    std::string have;
    for (const auto& s : splits_seen) have += (have.empty() ? "" : ", ") + s;
    throw Error(path + ": no images for split '" + split + "' (the archive has: " + (have.empty() ? "no image folders" : have) + ")");
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) {
    return x.cls != y.cls ? x.cls < y.cls : x.file < y.file;
  });
  Dataset ds;
  std::map<std::string, int64_t> class_index;
  for (const auto& en : entries)
    if (!class_index.count(en.cls)) {
      class_index[en.cls] = static_cast<int64_t>(ds.class_names.size());
      ds.class_names.push_back(en.cls);
    }
  ImageDecoder first_decoder;
  const ImageHeader first = first_decoder.header(entries[0].bytes.data(), entries[0].bytes.size(), path + ":" + entries[0].path);
  const int64_t channels = options.channels > 0 ? options.channels : first.channels;
  const int64_t n = static_cast<int64_t>(entries.size());
  ds.images = at::empty({n, channels, first.height, first.width}, at::kByte);
  ds.labels = at::empty({n}, at::kLong);
  auto* labels = ds.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) labels[i] = class_index[entries[static_cast<size_t>(i)].cls];
  uint8_t* out = ds.images.data_ptr<uint8_t>();
  const int64_t per_image = channels * first.height * first.width;
  int threads = options.num_threads > 0 ? options.num_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>(threads, n));
  std::atomic<int64_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<int64_t> error_index(static_cast<size_t>(threads), n);
  auto work = [&](int t) {
    ImageDecoder dec;
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      const Entry& en = entries[static_cast<size_t>(i)];
      const std::string where = path + ":" + en.path;
      try {
        ImageHeader h = dec.header(en.bytes.data(), en.bytes.size(), where);
        if (h.width != first.width || h.height != first.height)
          throw Error(where + ": image is " + std::to_string(h.width) + "×" + std::to_string(h.height) + ", but " +
                      entries[0].path + " is " + std::to_string(first.width) + "×" + std::to_string(first.height) +
                      " (all images must share one size)");
        dec.decode(en.bytes.data(), en.bytes.size(), h, channels, out + i * per_image, where);
      } catch (...) {
        if (i < error_index[static_cast<size_t>(t)]) {
          error_index[static_cast<size_t>(t)] = i;
          errors[static_cast<size_t>(t)] = std::current_exception();
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  // Report the first bad image in sample order.
  int64_t worst = n;
  std::exception_ptr err;
  for (size_t t = 0; t < errors.size(); ++t)
    if (errors[t] && error_index[t] < worst) {
      worst = error_index[t];
      err = errors[t];
    }
  if (err) std::rethrow_exception(err);
  return ds;
}

}  // namespace whittle::data
