#include "data/mnist.h"

#include <cstdio>
#include <cstring>
#include <sstream>

#include "data/io_util.h"
#include "core/file_util.h"
#include "core/error.h"

namespace whittle::data {
namespace {

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Reads an IDX file, checks its magic, and returns (dims, payload offset, bytes).
std::vector<uint8_t> read_idx(const std::string& path, uint32_t magic, const char* what, std::vector<int64_t>& dims) {
  std::vector<uint8_t> bytes = detail::read_maybe_gzip(path);
  const size_t ndim = magic & 0xffu;
  const size_t header = 4 + 4 * ndim;
  if (bytes.size() < 4)
    throw Error(path + ": truncated IDX file: " + std::to_string(bytes.size()) + " bytes, not even a magic number");
  const uint32_t got = detail::load_be32(bytes.data());
  if (got != magic)
    throw Error(path + ": bad magic " + hex32(got) + ", expected " + hex32(magic) + " (IDX " + what + ")");
  if (bytes.size() < header)
    throw Error(path + ": truncated IDX header: " + std::to_string(bytes.size()) + " bytes, expected " +
                std::to_string(header));
  // The sizes are checked before they are multiplied out or allocated: an item (one image, one
  // label) of at most 2^31 bytes, and a product that does not overflow.
  uint64_t payload = 1, item = 1;
  bool overflow = false;
  dims.clear();
  for (size_t d = 0; d < ndim; ++d) {
    uint32_t n = detail::load_be32(bytes.data() + 4 + 4 * d);
    dims.push_back(n);
    overflow = overflow || __builtin_mul_overflow(payload, uint64_t{n}, &payload);
    if (d > 0) overflow = overflow || __builtin_mul_overflow(item, uint64_t{n}, &item);
  }
  if (overflow || item > (uint64_t{1} << 31)) {
    std::ostringstream os;
    os << path << ": header gives " << what << " of size [";
    for (size_t d = 0; d < dims.size(); ++d) os << (d ? ", " : "") << dims[d];
    os << "]: implausibly large (damaged header?)";
    throw Error(os.str());
  }
  const uint64_t expected = header + payload;
  if (bytes.size() != expected) {
    std::ostringstream os;
    os << path << ": " << (bytes.size() < expected ? "truncated" : "trailing bytes") << ": header gives " << what
       << " of size [";
    for (size_t d = 0; d < dims.size(); ++d) os << (d ? ", " : "") << dims[d];
    os << "] (" << expected << " bytes in all) but the file holds " << bytes.size() << " bytes";
    throw Error(os.str());
  }
  return bytes;
}

}  // namespace

at::Tensor read_idx_images(const std::string& path) {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes = read_idx(path, 0x00000803u, "images", dims);
  at::Tensor images = at::empty({dims[0], 1, dims[1], dims[2]}, at::kByte);
  if (images.numel() > 0) std::memcpy(images.data_ptr<uint8_t>(), bytes.data() + 16, static_cast<size_t>(images.numel()));
  return images;
}

at::Tensor read_idx_labels(const std::string& path) {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes = read_idx(path, 0x00000801u, "labels", dims);
  at::Tensor labels = at::empty({dims[0]}, at::kLong);
  int64_t* out = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < dims[0]; ++i) out[i] = bytes[static_cast<size_t>(8 + i)];
  return labels;
}

Dataset read_mnist(const std::string& images_path, const std::string& labels_path) {
  Dataset d;
  d.images = read_idx_images(images_path);
  d.labels = read_idx_labels(labels_path);
  if (d.images.size(0) != d.labels.size(0))
    throw Error("count mismatch: " + images_path + " holds " + std::to_string(d.images.size(0)) + " images but " +
                labels_path + " holds " + std::to_string(d.labels.size(0)) + " labels");
  const int64_t* l = d.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < d.labels.numel(); ++i)
    if (l[i] > 9)
      throw Error(labels_path + ": label " + std::to_string(l[i]) + " of sample " + std::to_string(i) +
                  " is not a digit 0..9");
  for (int k = 0; k < 10; ++k) d.class_names.push_back(std::to_string(k));
  return d;
}

std::pair<std::string, std::string> find_mnist_files(const std::string& dir, const std::string& split) {
  std::string prefix;
  if (split == "train")
    prefix = "train";
  else if (split == "t10k" || split == "test")
    prefix = "t10k";
  else
    throw Error(dir + ": unknown MNIST split '" + split + "' (expected train, t10k or test)");
  auto find = [&](const std::string& stem) -> std::string {
    for (const char* ext : {".gz", ""}) {
      std::string p = join_path(dir, stem + ext);
      if (is_regular_file(p)) return p;
    }
    return {};
  };
  return {find(prefix + "-images-idx3-ubyte"), find(prefix + "-labels-idx1-ubyte")};
}

Dataset load_mnist(const std::string& dir, const std::string& split) {
  auto [images, labels] = find_mnist_files(dir, split);
  const std::string prefix = split == "train" ? "train" : "t10k";
  if (images.empty() || labels.empty()) {
    std::string missing = images.empty() ? prefix + "-images-idx3-ubyte" : prefix + "-labels-idx1-ubyte";
    throw Error(join_path(dir, missing) + "[.gz]: no such file (MNIST split '" + split + "')");
  }
  return read_mnist(images, labels);
}

}  // namespace whittle::data
