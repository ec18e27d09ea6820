#include "data/hdf5_dataset.h"

#include <ATen/Parallel.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string_view>
#include <mutex>

#include "data/io_util.h"
#include "core/file_util.h"
#include "core/error.h"
#include "core/hdf5_util.h"

namespace whittle::data {
namespace {

constexpr int64_t kFormatVersion = 1;

// The HDF5 library may be built without thread safety: every call from this module holds one lock.
using QuietHdf5 = hdf5::SilenceErrors;

// The most specific message on HDF5's error stack (then cleared), e.g. "truncated file: eof = …".
std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* err, void* client) -> herr_t {
        if (n == 0 && err != nullptr && err->desc != nullptr) *static_cast<std::string*>(client) = err->desc;
        return 0;
      },
      &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? std::string("HDF5 error") : reason;
}

// Owns an HDF5 identifier.
using Id = hdf5::Handle;

void reclaim_vlen(hid_t memtype, hid_t space, void* buf) {
#if H5_VERSION_GE(1, 12, 0)
  H5Treclaim(memtype, space, H5P_DEFAULT, buf);
#else
  H5Dvlen_reclaim(memtype, space, H5P_DEFAULT, buf);
#endif
}

// Checks every global heap collection of the file at `path` before HDF5 reads variable-length
// strings from one. HDF5 1.10 (Debian 12's libhdf5) loops forever on a collection holding a
// free-space object of size 0 (found by fuzz_hdf5_dataset): such a file is refused here instead.
// A collection is the bytes "GCOL", version 1, three reserved bytes, its size (8 bytes, little
// endian, at least 4096 and inside the file), then objects of [index u16, references u16, 4
// reserved bytes, size u64, data padded to 8]; index 0 is the free space, whose size covers its
// header. Data that merely contains "GCOL" is not mistaken for one: the header must fit too.
// Refuses a dataset whose declared size cannot come from this file before it is allocated (found
// by fuzz_hdf5_dataset: a damaged /images shape asked for 15 TB). Stored data are at most the
// file's bytes, or about 1032 times that when deflated (deflate's largest ratio).
void check_declared_bytes(const std::vector<hsize_t>& dims, uint64_t element_bytes, const std::string& path,
                          const std::string& where) {
  uint64_t bytes = element_bytes;
  bool overflow = false;
  for (hsize_t d : dims) overflow = overflow || __builtin_mul_overflow(bytes, uint64_t{d}, &bytes);
  const uint64_t limit = static_cast<uint64_t>(file_size(path)) * 1100;
  if (overflow || bytes > limit) {
    std::string shape;
    for (hsize_t d : dims) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    throw Error(where + ": declares [" + shape + "], more data than a file of " + std::to_string(file_size(path)) +
                " bytes can hold (damaged?)");
  }
}

struct DamagedHeap : Error {
  using Error::Error;
};

// The global heap collections of a file: by file offset, the size of each live object by index.
using GlobalHeaps = std::map<uint64_t, std::map<unsigned, uint64_t>>;

GlobalHeaps check_global_heaps(const std::string& path) {
  GlobalHeaps heaps;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open for reading");
  in.seekg(0, std::ios::end);
  const uint64_t file_bytes = static_cast<uint64_t>(in.tellg());
  const auto u64 = [](const char* b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(b[i]);
    return v;
  };
  // Scanned in chunks that overlap by a header's 16 bytes; each candidate collection is read whole.
  constexpr size_t kChunk = size_t{1} << 20;
  std::string chunk(kChunk + 16, '\0'), heap;
  for (uint64_t base = 0; base < file_bytes; base += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk + 16, file_bytes - base));
    in.clear();
    in.seekg(static_cast<std::streamoff>(base));
    in.read(chunk.data(), static_cast<std::streamsize>(n));
    const std::string_view view(chunk.data(), n);
    for (size_t at = view.find("GCOL"); at != std::string_view::npos && at < kChunk; at = view.find("GCOL", at + 1)) {
      // HDF5 checks the signature and the version, not the three reserved bytes (fuzz_hdf5_dataset:
      // a collection with a reserved byte set and a free-space object of size 0 looped forever).
      if (at + 16 > n || view[at + 4] != 1) continue;
      const uint64_t size = u64(view.data() + at + 8);
      if (size < 4096 || size > file_bytes - (base + at)) continue;
      heap.assign(static_cast<size_t>(size), '\0');
      in.clear();
      in.seekg(static_cast<std::streamoff>(base + at));
      in.read(heap.data(), static_cast<std::streamsize>(size));
      std::map<unsigned, uint64_t>& objects = heaps[base + at];
      for (size_t p = 16; p + 16 <= heap.size();) {
        const unsigned index = static_cast<uint8_t>(heap[p]) | static_cast<unsigned>(static_cast<uint8_t>(heap[p + 1])) << 8;
        const uint64_t object = u64(heap.data() + p + 8);
        const uint64_t need = index > 0 ? 16 + ((object + 7) / 8) * 8 : object;
        if (need == 0 || object > size)
          throw DamagedHeap(path + ": the global heap at byte " + std::to_string(base + at) + " is damaged (an object of size " +
                            std::to_string(object) + "): the file is corrupt");
        if (index > 0 && p + need <= heap.size()) objects[index] = object;  // an object that fits
        p += static_cast<size_t>(need);
      }
    }
  }
  return heaps;
}

// ---- the references of variable-length strings, checked before HDF5 follows them
//
// HDF5 1.10 follows a string's reference into the global heap without checking that the object
// index exists in the collection (a damaged index read past the collection's object table and
// crashed: fuzz_hdf5_dataset). So the references are read first as they are stored, through a
// conversion from a variable-length string to an opaque type tagged kRawReferenceTag that leaves
// the stored bytes alone: per string its length (u32), the collection's address (the file's
// address size) and the object's index (u32), little endian.

constexpr const char* kRawReferenceTag = "whittle.vlen_reference";

herr_t keep_stored_references(hid_t src, hid_t dst, H5T_cdata_t* cdata, size_t, size_t, size_t, void*, void*, hid_t) {
  if (cdata->command != H5T_CONV_INIT) return 0;  // H5T_CONV_CONV: the bytes stay as read; H5T_CONV_FREE: nothing
  if (H5Tget_class(src) != H5T_STRING || H5Tis_variable_str(src) <= 0 || H5Tget_class(dst) != H5T_OPAQUE ||
      H5Tget_size(src) != H5Tget_size(dst))
    return -1;
  char* tag = H5Tget_tag(dst);
  const bool ours = tag != nullptr && std::strcmp(tag, kRawReferenceTag) == 0;
  H5free_memory(tag);
  if (!ours) return -1;
  cdata->need_bkg = H5T_BKG_NO;
  return 0;
}

// Checks that every variable-length string of `obj` (an attribute when is_attr, else a dataset;
// n strings) refers to a live object of a collection in `heaps` no shorter than the string.
// Throws DamagedHeap otherwise.
void check_string_references(hid_t obj, bool is_attr, hssize_t n, const GlobalHeaps& heaps, const std::string& where,
                             const std::string& path) {
  static std::once_flag registered;
  std::call_once(registered, [] {
    Id from(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(from.get(), H5T_VARIABLE);
    Id to(H5Tcreate(H5T_OPAQUE, 16), H5Tclose);
    H5Tset_tag(to.get(), kRawReferenceTag);
    H5Tregister(H5T_PERS_SOFT, "whittle: stored references of strings", from.get(), to.get(), keep_stored_references);
  });
  Id file(H5Iget_file_id(obj), H5Fclose);
  Id fcpl(file.valid() ? H5Fget_create_plist(file.get()) : H5I_INVALID_HID, H5Pclose);
  size_t address_bytes = 0, length_bytes = 0;
  hsize_t userblock = 0;
  if (!fcpl.valid() || H5Pget_sizes(fcpl.get(), &address_bytes, &length_bytes) < 0 ||
      H5Pget_userblock(fcpl.get(), &userblock) < 0 || address_bytes < 2 || address_bytes > 8)
    throw Error(where + ": cannot read the file's address size (" + hdf5_reason() + ")");
  const size_t record = 4 + address_bytes + 4;
  Id raw(H5Tcreate(H5T_OPAQUE, record), H5Tclose);
  H5Tset_tag(raw.get(), kRawReferenceTag);
  std::vector<uint8_t> stored(static_cast<size_t>(n) * record);
  const herr_t rc = is_attr ? H5Aread(obj, raw.get(), stored.data())
                            : H5Dread(obj, raw.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, stored.data());
  if (rc < 0) throw Error(where + ": cannot read (" + hdf5_reason() + ")");
  const auto little_endian = [](const uint8_t* b, size_t bytes) {
    uint64_t v = 0;
    for (size_t i = bytes; i-- > 0;) v = v << 8 | b[i];
    return v;
  };
  for (hssize_t i = 0; i < n; ++i) {
    const uint8_t* r = stored.data() + static_cast<size_t>(i) * record;
    const uint64_t length = little_endian(r, 4);
    if (length == 0) continue;  // an empty string refers to nothing
    const uint64_t address = little_endian(r + 4, address_bytes) + userblock;
    const auto index = static_cast<unsigned>(little_endian(r + 4 + address_bytes, 4));
    const auto heap = heaps.find(address);
    const bool live = heap != heaps.end() && heap->second.count(index) > 0;
    if (!live || heap->second.at(index) < length)
      throw DamagedHeap(where + ": string " + std::to_string(i) + " refers to " +
                        (live ? "a shorter object" : "no object") + " of the global heap (object " + std::to_string(index) +
                        " at byte " + std::to_string(address) + "): the file " + path + " is corrupt");
  }
}

// Reads a 0-D or 1-D string attribute (is_attr) or dataset into a vector of strings. Before the
// first variable-length read of the file `path`, its global heaps are checked (*heaps, kept for
// the next reads), and before each, the references its strings hold.
std::vector<std::string> read_strings(hid_t obj, bool is_attr, const std::string& where, const std::string& path,
                                      std::optional<GlobalHeaps>* heaps) {
  Id type(is_attr ? H5Aget_type(obj) : H5Dget_type(obj), H5Tclose);
  Id space(is_attr ? H5Aget_space(obj) : H5Dget_space(obj), H5Sclose);
  if (!type.valid() || !space.valid()) throw Error(where + ": cannot read (" + hdf5_reason() + ")");
  if (H5Tget_class(type.get()) != H5T_STRING) throw Error(where + ": expected strings");
  if (H5Sget_simple_extent_ndims(space.get()) > 1) throw Error(where + ": expected a 1-D array of strings");
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  std::vector<std::string> out;
  if (n <= 0) return out;
  auto read = [&](hid_t memtype, void* buf) {
    herr_t rc = is_attr ? H5Aread(obj, memtype, buf) : H5Dread(obj, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    if (rc < 0) throw Error(where + ": cannot read (" + hdf5_reason() + ")");
  };
  Id memtype(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_cset(memtype.get(), H5Tget_cset(type.get()));
  if (H5Tis_variable_str(type.get()) > 0) {
    if (!heaps->has_value()) *heaps = check_global_heaps(path);
    check_string_references(obj, is_attr, n, **heaps, where, path);
    H5Tset_size(memtype.get(), H5T_VARIABLE);
    std::vector<char*> buf(static_cast<size_t>(n), nullptr);
    read(memtype.get(), buf.data());
    for (char* s : buf) out.emplace_back(s ? s : "");
    reclaim_vlen(memtype.get(), space.get(), buf.data());
  } else {
    const size_t size = H5Tget_size(type.get());
    H5Tset_size(memtype.get(), size);
    H5Tset_strpad(memtype.get(), H5T_STR_NULLPAD);
    std::vector<char> buf(static_cast<size_t>(n) * size, '\0');
    read(memtype.get(), buf.data());
    for (hssize_t i = 0; i < n; ++i) {
      const char* s = buf.data() + static_cast<size_t>(i) * size;
      size_t len = strnlen(s, size);
      while (len > 0 && s[len - 1] == ' ') --len;  // space-padded strings
      out.emplace_back(s, len);
    }
  }
  return out;
}

// Opens dataset `name` of `file`, checking it is an integer array of rank `rank`; returns its dims.
std::vector<hsize_t> integer_dims(hid_t ds, const std::string& where, int rank, const char* expected) {
  Id type(H5Dget_type(ds), H5Tclose);
  Id space(H5Dget_space(ds), H5Sclose);
  if (!type.valid() || !space.valid()) throw Error(where + ": cannot read (" + hdf5_reason() + ")");
  if (H5Tget_class(type.get()) != H5T_INTEGER) throw Error(where + ": is not an integer array, expected " + expected);
  const int ndims = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(ndims, 0)));
  if (ndims > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  if (ndims != rank) {
    std::string shape = "[";
    for (size_t i = 0; i < dims.size(); ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
    throw Error(where + ": has shape " + shape + "], expected " + expected);
  }
  return dims;
}

void write_string_attribute(hid_t obj, const char* name, const std::vector<std::string>& values, bool scalar,
                            const std::string& where) {
  Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  hsize_t n = values.size();
  Id space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  Id attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  std::vector<const char*> ptrs;
  for (const std::string& v : values) ptrs.push_back(v.c_str());
  if (!attr.valid() || H5Awrite(attr.get(), type.get(), ptrs.data()) < 0)
    throw Error(where + ": cannot write attribute '" + name + "' (" + hdf5_reason() + ")");
}

// Writes an N-D dataset; chunked and deflated when level > 0 (chunks of whole leading-axis rows).
void write_array(hid_t file, const char* name, hid_t file_type, hid_t mem_type, const std::vector<hsize_t>& dims,
                 size_t row_bytes, int level, const void* data, const std::string& where) {
  Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (level > 0 && dims[0] > 0) {
    std::vector<hsize_t> chunk = dims;
    const hsize_t rows = std::max<hsize_t>(1, (1u << 20) / std::max<size_t>(row_bytes, 1));
    chunk[0] = std::min(dims[0], rows);
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    H5Pset_deflate(dcpl.get(), static_cast<unsigned>(level));
  }
  Id ds(H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) throw Error(where + ": cannot create dataset '" + name + "' (" + hdf5_reason() + ")");
  if (H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    throw Error(where + ": cannot write dataset '" + name + "' (" + hdf5_reason() + ")");
  if (!ds.close()) throw Error(where + ": cannot write dataset '" + name + "' (" + hdf5_reason() + ")");
}

}  // namespace

namespace {

// The read itself, with HDF5's lock held by the caller.
Dataset read_hdf5_dataset_locked(const std::string& path) {
  QuietHdf5 quiet;
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw Error(path + ": cannot open HDF5 file (" + hdf5_reason() + ")");
  std::optional<GlobalHeaps> heaps;  // see check_global_heaps
  // Another whittle file (a checkpoint) says what it is in its `format` attribute.
  if (H5Aexists(file.get(), "format") > 0 && H5Lexists(file.get(), "images", H5P_DEFAULT) <= 0) {
    std::string format;
    try {
      Id attr(H5Aopen(file.get(), "format", H5P_DEFAULT), H5Aclose);
      const std::vector<std::string> v = read_strings(attr.get(), true, path, path, &heaps);
      if (!v.empty()) format = v.front();
    } catch (const DamagedHeap&) {
      throw;
    } catch (const std::exception&) {
    }
    if (format == "whittle.checkpoint") throw Error(path + ": is a whittle checkpoint (a model), not a dataset");
  }

  if (H5Aexists(file.get(), "format_version") > 0) {
    Id attr(H5Aopen(file.get(), "format_version", H5P_DEFAULT), H5Aclose);
    int64_t version = 0;
    if (!attr.valid() || H5Aread(attr.get(), H5T_NATIVE_INT64, &version) < 0)
      throw Error(path + ": attribute format_version: cannot read (" + hdf5_reason() + ")");
    if (version > kFormatVersion)
      throw Error(path + ": dataset format_version " + std::to_string(version) + " is newer than this whittle reads (" +
                  std::to_string(kFormatVersion) + "); upgrade whittle");
  }
  Dataset d;
  for (const char* name : {"images", "labels"})
    if (H5Lexists(file.get(), name, H5P_DEFAULT) <= 0)
      throw Error(path + ": no dataset '/" + name + "' (expected " +
                  (std::strcmp(name, "images") == 0 ? "uint8 [N, C, H, W]" : "int64 [N]") + ")");
  {
    const std::string where = path + ": /images";
    Id ds(H5Dopen2(file.get(), "images", H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw Error(where + ": cannot open (" + hdf5_reason() + ")");
    std::vector<hsize_t> dims = integer_dims(ds.get(), where, 4, "uint8 [N, C, H, W]");
    Id type(H5Dget_type(ds.get()), H5Tclose);
    if (H5Tget_size(type.get()) != 1 || H5Tget_sign(type.get()) != H5T_SGN_NONE)
      throw Error(where + ": element type must be uint8");
    if (dims[1] != 1 && dims[1] != 3)
      throw Error(where + ": has " + std::to_string(dims[1]) + " channels, expected 1 (gray) or 3 (RGB)");
    check_declared_bytes(dims, 1, path, where);
    d.images = at::empty({static_cast<int64_t>(dims[0]), static_cast<int64_t>(dims[1]), static_cast<int64_t>(dims[2]),
                          static_cast<int64_t>(dims[3])},
                         at::kByte);
    if (d.images.numel() > 0 &&
        H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.images.data_ptr<uint8_t>()) < 0)
      throw Error(where + ": cannot read (" + hdf5_reason() + ")");
  }
  {
    const std::string where = path + ": /labels";
    Id ds(H5Dopen2(file.get(), "labels", H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw Error(where + ": cannot open (" + hdf5_reason() + ")");
    std::vector<hsize_t> dims = integer_dims(ds.get(), where, 1, "int64 [N]");
    if (static_cast<int64_t>(dims[0]) != d.images.size(0))
      throw Error(path + ": count mismatch: /images holds " + std::to_string(d.images.size(0)) +
                  " images but /labels holds " + std::to_string(dims[0]) + " labels");
    check_declared_bytes(dims, 8, path, where);
    d.labels = at::empty({static_cast<int64_t>(dims[0])}, at::kLong);
    if (dims[0] > 0 &&
        H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.labels.data_ptr<int64_t>()) < 0)
      throw Error(where + ": cannot read (" + hdf5_reason() + ")");
  }
  if (H5Aexists(file.get(), "class_names") > 0) {
    Id attr(H5Aopen(file.get(), "class_names", H5P_DEFAULT), H5Aclose);
    if (!attr.valid()) throw Error(path + ": attribute class_names: cannot open (" + hdf5_reason() + ")");
    d.class_names = read_strings(attr.get(), true, path + ": attribute class_names", path, &heaps);
  } else if (H5Lexists(file.get(), "class_names", H5P_DEFAULT) > 0) {
    Id ds(H5Dopen2(file.get(), "class_names", H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw Error(path + ": /class_names: cannot open (" + hdf5_reason() + ")");
    d.class_names = read_strings(ds.get(), false, path + ": /class_names", path, &heaps);
  }
  H5Eclear2(H5E_DEFAULT);
  d.validate(path);
  return d;
}

// Runs read_hdf5_dataset_locked(path) once in a child process first. libhdf5 1.10 (Debian 12's)
// has memory-safety bugs on damaged files that whittle's own checks cannot all foresee (found by
// fuzz_hdf5_dataset: an attribute name without its terminating zero read past its buffer); in a
// child, such a crash ends the child, and the parent turns it into an Error instead of crashing or
// reading what a damaged file made of its memory. The child reports its own Error's message
// through a pipe. Called with HDF5's lock held (so no other thread is inside libhdf5 at the fork);
// the child does not take it again, runs ATen single-threaded (an OpenMP pool does not survive a
// fork) and leaves with _exit. The cost: the file is read twice.
void read_in_child_first(const std::string& path) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(path + ": cannot check the file in a child process (pipe: " + std::strerror(errno) + ")");
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(path + ": cannot check the file in a child process (fork: " + std::strerror(errno) + ")");
  }
  if (pid == 0) {
    ::close(fds[0]);
    int code = 0;
    std::string message;
    try {
      at::set_num_threads(1);
      read_hdf5_dataset_locked(path);
    } catch (const std::exception& e) {
      message = e.what();
      code = 1;
    }
    for (size_t done = 0; done < message.size();) {
      const ssize_t w = ::write(fds[1], message.data() + done, message.size() - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string message;
  char buf[4096];
  for (;;) {
    const ssize_t r = ::read(fds[0], buf, sizeof buf);
    if (r > 0) message.append(buf, static_cast<size_t>(r));
    else if (r == 0 || errno != EINTR) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 1 && !message.empty()) throw Error(message);
  throw Error(path + ": the HDF5 library failed on this file (" +
              (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                   : "exit status " + std::to_string(WEXITSTATUS(status))) +
              "): the file is damaged");
}

}  // namespace

Dataset read_hdf5_dataset(const std::string& path) {
  if (!is_regular_file(path)) throw Error(path + ": no such file");
  if (!is_hdf5_file(path)) throw Error(path + ": not an HDF5 file (no HDF5 signature)");
  std::lock_guard<std::mutex> lock(hdf5::library_mutex());
  read_in_child_first(path);
  return read_hdf5_dataset_locked(path);
}

void write_hdf5_dataset(const Dataset& dataset, const std::string& path, const Hdf5WriteOptions& options) {
  dataset.validate(path);
  if (dataset.size() == 0) throw Error(path + ": refusing to write a dataset that holds no images");
  if (options.compression < 0 || options.compression > 9)
    throw Error(path + ": compression level must be 0..9, got " + std::to_string(options.compression));
  std::lock_guard<std::mutex> lock(hdf5::library_mutex());
  QuietHdf5 quiet;
  write_atomic(path, [&](const std::string& tmp) {
    Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.valid()) throw Error(path + ": cannot create (" + hdf5_reason() + ")");
    const at::Tensor images = dataset.images.contiguous();
    const at::Tensor labels = dataset.labels.contiguous();
    std::vector<hsize_t> image_dims;
    for (int64_t s : images.sizes()) image_dims.push_back(static_cast<hsize_t>(s));
    const size_t image_bytes = static_cast<size_t>(images.numel() / std::max<int64_t>(images.size(0), 1));
    write_array(file.get(), "images", H5T_STD_U8LE, H5T_NATIVE_UINT8, image_dims, image_bytes, options.compression,
                images.data_ptr<uint8_t>(), path);
    write_array(file.get(), "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {static_cast<hsize_t>(labels.size(0))}, 8,
                options.compression, labels.data_ptr<int64_t>(), path);
    if (!dataset.class_names.empty()) write_string_attribute(file.get(), "class_names", dataset.class_names, false, path);
    write_string_attribute(file.get(), "format", {"whittle.dataset"}, true, path);
    {
      Id space(H5Screate(H5S_SCALAR), H5Sclose);
      Id attr(H5Acreate2(file.get(), "format_version", H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose);
      if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &kFormatVersion) < 0)
        throw Error(path + ": cannot write attribute 'format_version' (" + hdf5_reason() + ")");
    }
    if (!file.close()) throw Error(path + ": cannot finish writing (" + hdf5_reason() + ")");
  });
}

}  // namespace whittle::data
