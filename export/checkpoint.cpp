#include "export/checkpoint.h"

#include <ATen/ATen.h>
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/file_util.h"
#include "core/hdf5_util.h"
#include "core/json_number.h"
#include "graph/op_registry.h"
#include "graph/serialize.h"
#include "graph/version.h"
#include "fuse/fuse.h"
#include "quantize/pack.h"
#include "quantize/quantize.h"

namespace whittle {

namespace {

using H5Id = hdf5::Handle;

hid_t h5_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return H5T_NATIVE_FLOAT;
    case at::kDouble: return H5T_NATIVE_DOUBLE;
    case at::kLong: return H5T_NATIVE_INT64;
    case at::kInt: return H5T_NATIVE_INT32;
    case at::kShort: return H5T_NATIVE_INT16;
    case at::kChar: return H5T_NATIVE_INT8;
    case at::kByte: return H5T_NATIVE_UINT8;
    case at::kBool: return H5T_NATIVE_UINT8;
    default: throw Error(std::string("checkpoint: cannot store tensors of dtype ") + c10::toString(t));
  }
}

uint32_t crc_of(const void* data, size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    uInt chunk = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    bytes -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

void write_attr_string(hid_t obj, const char* name, const std::string& value) {
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(value.size(), 1));
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  if (!attr.valid() || H5Awrite(attr.get(), type.get(), padded.data()) < 0)
    throw Error(std::string("checkpoint: cannot write attribute '") + name + "'");
}

void write_attr_int(hid_t obj, const char* name, int64_t value) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0)
    throw Error(std::string("checkpoint: cannot write attribute '") + name + "'");
}

void write_string_dataset(hid_t parent, const char* name, const std::string& text) {
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(text.size(), 1));
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id ds(H5Dcreate2(parent, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  std::string padded = text.empty() ? std::string(1, '\0') : text;
  if (!ds.valid() || H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, padded.data()) < 0)
    throw Error(std::string("checkpoint: cannot write dataset '") + name + "'");
  write_attr_int(ds.get(), "crc32", crc_of(padded.data(), padded.size()));
}

// Writes `text` as a 1-D uint8 dataset compressed with HDF5's deflate filter (zlib; h5py and any
// HDF5 build with zlib read it transparently). The graph structure is text that compresses ~15×,
// and in a packed checkpoint it would otherwise outweigh the weights. crc32 is over the raw text.
void write_compressed_text(hid_t parent, const char* name, const std::string& text) {
  const hsize_t n = std::max<size_t>(text.size(), 1);
  const std::string padded = text.empty() ? std::string(1, '\0') : text;
  H5Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0) {
    H5Pset_chunk(dcpl.get(), 1, &n);
    H5Pset_deflate(dcpl.get(), 6);
  }
  H5Id ds(H5Dcreate2(parent, name, H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid() || H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, padded.data()) < 0)
    throw Error(std::string("checkpoint: cannot write dataset '") + name + "'");
  write_attr_int(ds.get(), "crc32", crc_of(padded.data(), padded.size()));
  write_attr_string(ds.get(), "encoding", "utf-8");
}

// All tensors of a checkpoint go into one contiguous uint8 dataset, /tensors/data, each at an
// 8-byte aligned offset; /tensors/index (compressed JSON) says where each one is. One dataset for
// all tensors keeps HDF5's per-object overhead (a few hundred bytes each) out of small packed
// checkpoints, so the file stays close to the bits it stores.
struct TensorBlob {
  std::string bytes;
  nlohmann::ordered_json index = nlohmann::ordered_json::array();

  void add(const Node& n, const std::string& name, const at::Tensor& tensor, const char* role) {
    const at::ScalarType dtype = tensor.scalar_type();
    (void)h5_type(dtype);  // rejects dtypes a checkpoint cannot hold
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    if (t.scalar_type() == at::kBool) t = t.to(at::kByte);
    while (bytes.size() % 8) bytes.push_back('\0');
    const size_t offset = bytes.size();
    const auto nbytes = static_cast<size_t>(t.nbytes());
    bytes.append(static_cast<const char*>(t.data_ptr()), nbytes);
    nlohmann::ordered_json e{{"node", n.name},
                             {"name", name},
                             {"role", role},
                             {"dtype", dtype_name(dtype)},
                             {"shape", t.sizes().vec()},
                             {"offset", offset},
                             {"nbytes", nbytes},
                             {"crc32", crc_of(t.data_ptr(), nbytes)}};
    if (name == "weight_codes" && has_weight_transform(n, "packed")) {
      // Enough to decode the codes without parsing the graph (docs/checkpoint-format.md).
      e["packed"] = {{"bits", n.attr_int("weight_bits")},
                     {"packed_bits", quantize::storage_bits(n.attr_int("weight_bits"))},
                     {"shape", n.attr_ints("weight_shape")},
                     {"encoding", n.attr_str("weight_encoding")},
                     {"axis", n.attr_int("weight_axis")}};
    }
    index.push_back(std::move(e));
  }

  void write(hid_t file) const {
    H5Id group(H5Gcreate2(file, "tensors", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!group.valid()) throw Error("checkpoint: cannot create group 'tensors'");
    write_compressed_text(group.get(), "index", index.dump());
    const hsize_t n = bytes.size();
    H5Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_obj_track_times(dcpl.get(), false);
    H5Id ds(H5Dcreate2(group.get(), "data", H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid() || (n > 0 && H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) < 0))
      throw Error("checkpoint: cannot write the tensor data");
  }
};

std::string utc_now() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---------------------------------------------------------------- reading

struct Reader {
  std::string path;
  [[noreturn]] void fail(const std::string& what) const { throw Error(path + ": " + what); }

  H5Id open_dataset(hid_t parent, const std::string& name, bool required = true) const {
    if (H5Lexists(parent, name.c_str(), H5P_DEFAULT) <= 0) {
      if (required) fail("missing dataset '" + name + "' (not a whittle checkpoint, or damaged)");
      return H5Id();
    }
    H5Id ds(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) fail("cannot open dataset '" + name + "' (file damaged)");
    return ds;
  }

  // False when absent; a failure to look (damaged object header: HDF5's checksum) is an error.
  bool has_attr(hid_t obj, const char* name) const {
    const htri_t found = H5Aexists(obj, name);
    if (found < 0) fail(std::string("cannot read the attributes (looking for '") + name + "'): the file is damaged");
    return found > 0;
  }

  int64_t read_attr_int(hid_t obj, const char* name, const std::string& where) const {
    if (!has_attr(obj, name)) fail(where + ": missing attribute '" + name + "'");
    H5Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    H5Id type(attr.valid() ? H5Aget_type(attr.get()) : -1, H5Tclose);
    if (!attr.valid() || !type.valid() || H5Tget_class(type.get()) != H5T_INTEGER)
      fail(where + ": attribute '" + std::string(name) + "' is not an integer");
    int64_t v = 0;
    if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0) fail(where + ": cannot read attribute '" + std::string(name) + "'");
    return v;
  }

  std::string read_attr_string(hid_t obj, const char* name, const std::string& where) const {
    if (!has_attr(obj, name)) fail(where + ": missing attribute '" + name + "'");
    H5Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    H5Id type(attr.valid() ? H5Aget_type(attr.get()) : -1, H5Tclose);
    if (!attr.valid() || !type.valid() || H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0)
      fail(where + ": attribute '" + std::string(name) + "' is not a fixed-length string");
    size_t size = H5Tget_size(type.get());
    if (size == 0 || size > (1u << 20)) fail(where + ": attribute '" + std::string(name) + "' has an implausible size");
    std::string s(size, '\0');
    if (H5Aread(attr.get(), type.get(), s.data()) < 0) fail(where + ": cannot read attribute '" + std::string(name) + "'");
    s.resize(std::strlen(s.c_str()));
    return s;
  }

  // Reads the graph structure: a 1-D uint8 dataset of UTF-8 text, deflate-compressed (format
  // version 2), or a scalar fixed-length string (version 1); checks its CRC.
  std::string read_text(hid_t parent, const std::string& name) const {
    H5Id ds = open_dataset(parent, name, true);
    H5Id type(H5Dget_type(ds.get()), H5Tclose);
    if (type.valid() && H5Tget_class(type.get()) == H5T_STRING) return read_string(parent, name, true);
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    H5Id native(type.valid() ? H5Tget_native_type(type.get(), H5T_DIR_DEFAULT) : -1, H5Tclose);
    if (!native.valid() || H5Tequal(native.get(), H5T_NATIVE_UINT8) <= 0 || H5Sget_simple_extent_ndims(space.get()) != 1)
      fail("dataset '" + name + "' is neither a string nor 1-D uint8 text");
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space.get(), &n, nullptr);
    if (n == 0 || n > (hsize_t{1} << 31)) fail("dataset '" + name + "' has an implausible size");
    std::string s(static_cast<size_t>(n), '\0');
    if (H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()) < 0)
      fail("cannot read dataset '" + name + "' (file truncated or damaged)");
    auto crc = static_cast<uint32_t>(read_attr_int(ds.get(), "crc32", "dataset '" + name + "'"));
    if (crc_of(s.data(), s.size()) != crc) fail("dataset '" + name + "' is corrupted (CRC-32 mismatch)");
    s.resize(std::strlen(s.c_str()));
    return s;
  }

  // Reads a scalar fixed-length string dataset and checks its CRC.
  std::string read_string(hid_t parent, const std::string& name, bool required) const {
    H5Id ds = open_dataset(parent, name, required);
    if (!ds.valid()) return "";
    H5Id type(H5Dget_type(ds.get()), H5Tclose);
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    if (!type.valid() || H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0 ||
        H5Sget_simple_extent_type(space.get()) != H5S_SCALAR)
      fail("dataset '" + name + "' is not a fixed-length string");
    size_t size = H5Tget_size(type.get());
    hsize_t storage = H5Dget_storage_size(ds.get());
    if (size == 0 || storage != size) fail("dataset '" + name + "' is truncated (" + std::to_string(storage) + " of " + std::to_string(size) + " bytes)");
    std::string s(size, '\0');
    if (H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()) < 0) fail("cannot read dataset '" + name + "' (file damaged)");
    auto crc = static_cast<uint32_t>(read_attr_int(ds.get(), "crc32", "dataset '" + name + "'"));
    if (crc_of(s.data(), s.size()) != crc) fail("dataset '" + name + "' is corrupted (CRC-32 mismatch)");
    s.resize(std::strlen(s.c_str()));
    return s;
  }

  // The tensor index (node, name → where in /tensors/data) and the data itself, checked against
  // each other before anything is trusted.
  struct Stored {
    std::string role, dtype;
    Shape shape;
    uint64_t offset = 0, nbytes = 0;
    uint32_t crc = 0;
    int64_t packed_bits = 0;  ///< the width packed codes were written at (index entry `packed`); 0 when not packed
  };
  std::map<std::pair<std::string, std::string>, Stored> index;
  mutable std::set<std::pair<std::string, std::string>> used;  // the entries read_tensor returned
  std::string data;

  void read_tensors(hid_t file) {
    if (H5Lexists(file, "tensors", H5P_DEFAULT) <= 0) fail("missing group 'tensors'");
    H5Id group(H5Gopen2(file, "tensors", H5P_DEFAULT), H5Gclose);
    if (!group.valid()) fail("cannot open group 'tensors'");
    const std::string text = read_text(group.get(), "index");
    H5Id ds = open_dataset(group.get(), "data");
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    H5Id type(H5Dget_type(ds.get()), H5Tclose);
    H5Id native(type.valid() ? H5Tget_native_type(type.get(), H5T_DIR_DEFAULT) : -1, H5Tclose);
    if (!native.valid() || H5Tequal(native.get(), H5T_NATIVE_UINT8) <= 0 || H5Sget_simple_extent_ndims(space.get()) != 1)
      fail("dataset 'tensors/data' is not 1-D uint8");
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space.get(), &n, nullptr);
    const hsize_t storage = H5Dget_storage_size(ds.get());
    if (storage != n) fail("tensor data truncated (" + std::to_string(storage) + " of " + std::to_string(n) + " bytes stored)");
    // The data are stored uncompressed: they cannot be larger than the file (a damaged size would
    // otherwise ask for any amount of memory).
    if (n > static_cast<hsize_t>(file_size(path)))
      fail("tensor data declared as " + std::to_string(n) + " bytes, more than the file's " + std::to_string(file_size(path)));
    data.assign(static_cast<size_t>(n), '\0');
    if (n > 0 && H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0)
      fail("cannot read the tensor data (file truncated or damaged)");
    try {
      for (const auto& e : nlohmann::json::parse(text)) {
        const std::string node = e.at("node").get<std::string>(), name = e.at("name").get<std::string>();
        Stored st;
        st.role = e.at("role").get<std::string>();
        st.dtype = e.at("dtype").get<std::string>();
        const std::string where = "tensor index entry '" + node + "." + name + "'";
        st.shape = json_int64s(e.at("shape"), where + ": shape");
        st.offset = json_uint64(e.at("offset"), where + ": offset");
        st.nbytes = json_uint64(e.at("nbytes"), where + ": nbytes");
        st.crc = static_cast<uint32_t>(json_uint64(e.at("crc32"), where + ": crc32", std::numeric_limits<uint32_t>::max()));
        if (e.contains("packed")) {
          const auto& packed = e.at("packed");
          if (!packed.is_object() || !packed.contains("packed_bits")) fail(where + ": 'packed' without packed_bits (file damaged)");
          const uint64_t bits = json_uint64(packed.at("packed_bits"), where + ": packed_bits");
          if (bits < 1 || bits > 8) fail(where + ": packed_bits " + std::to_string(bits) + ", not 1 to 8 (file damaged)");
          st.packed_bits = static_cast<int64_t>(bits);
        }
        if (st.offset > data.size() || st.nbytes > data.size() - st.offset)
          fail("tensor '" + node + "." + name + "' lies outside the tensor data (file damaged)");
        // One entry a tensor: with two, which one was meant cannot be told.
        if (!index.emplace(std::make_pair(node, name), std::move(st)).second)
          fail("the tensor index has two entries for tensor '" + node + "." + name + "' (file damaged)");
      }
    } catch (const nlohmann::json::exception& ex) {
      fail(std::string("malformed tensor index (") + ex.what() + ")");
    } catch (const Error& ex) {
      if (std::string(ex.what()).rfind(path, 0) == 0) throw;  // already named by fail()
      fail(std::string("malformed tensor index: ") + ex.what());
    }
  }

  // Every packed node's codes checked against their index entry's packing: the width is the one
  // this whittle writes (storage_bits) or the wider field of format version 3 (3-bit codes in 4
  // bits, 5..7-bit codes in 8), and the byte count is that width's. Codes in the wider fields are
  // repacked, so that every packed node in memory has one layout.
  void check_packed_codes(Graph& graph) const {
    for (Node& n : graph.nodes()) {
      if (n.weight_transforms != std::vector<std::string>{"packed"}) continue;
      const std::string where = "tensor '" + n.name + ".weight_codes'";
      auto it = index.find({n.name, "weight_codes"});
      if (it == index.end() || it->second.packed_bits == 0) fail(where + ": no packing in its index entry (file damaged)");
      if (!n.has_attr("weight_bits") || !n.has_attr("weight_shape") || !n.buffers.contains("weight_codes"))
        fail("node '" + n.name + "': packed weight without weight_bits, weight_shape or weight_codes (file damaged)");
      const int64_t bits = n.attr_int("weight_bits"), stored = it->second.packed_bits;
      const int64_t want = quantize::storage_bits(bits), version3 = bits == 3 ? 4 : bits >= 5 && bits <= 7 ? 8 : want;
      if (stored != want && stored != version3)
        fail(where + ": " + std::to_string(bits) + "-bit codes stored at packed_bits " + std::to_string(stored) +
             " (file damaged)");
      int64_t count = 1;
      for (int64_t d : n.attr_ints("weight_shape")) count *= d;
      const at::Tensor& codes = n.buffers.at("weight_codes");
      if (codes.dim() != 1 || codes.numel() != quantize::packed_size(count, stored))
        fail(where + ": " + std::to_string(codes.numel()) + " bytes for " + std::to_string(count) + " codes of " +
             std::to_string(stored) + " bits, which take " + std::to_string(quantize::packed_size(count, stored)) +
             " (file damaged)");
      if (stored == want) continue;
      try {
        n.buffers.set("weight_codes", quantize::pack_codes(quantize::unpack_codes(codes, stored, count), want));
      } catch (const Error& e) {
        fail(where + ": " + e.what());
      }
    }
  }

  at::Tensor read_tensor(const std::string& node, TensorRole role, const std::string& name, const Shape& shape,
                         at::ScalarType dtype) const {
    const std::string where = "tensor '" + node + "." + name + "'";
    auto it = index.find({node, name});
    if (it == index.end()) fail("missing " + where);
    used.insert(it->first);
    const Stored& st = it->second;
    const std::string want_role = role == TensorRole::kParam ? "param" : "buffer";
    if (st.role != want_role) fail(where + ": stored as the wrong role (expected " + want_role + ")");
    if (st.dtype != dtype_name(dtype)) fail(where + ": stored dtype " + st.dtype + " differs from the graph's " + dtype_name(dtype));
    if (st.shape != shape) fail(where + ": stored shape " + shape_str(st.shape) + " differs from the graph's " + shape_str(shape));
    const at::ScalarType stored_as = dtype == at::kBool ? at::kByte : dtype;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (st.nbytes != static_cast<uint64_t>(numel) * c10::elementSize(stored_as))
      fail(where + ": " + std::to_string(st.nbytes) + " bytes stored for " + shape_str(shape) + " " + st.dtype);
    const char* src = data.data() + st.offset;
    if (crc_of(src, static_cast<size_t>(st.nbytes)) != st.crc) fail(where + " is corrupted (CRC-32 mismatch)");
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(stored_as));
    if (st.nbytes > 0) std::memcpy(t.data_ptr(), src, static_cast<size_t>(st.nbytes));
    // A weight that is NaN or infinite was saved from a model that had diverged (the CRC only says
    // the bytes are the ones written): such a model is refused, not loaded.
    if (at::isFloatingType(stored_as) && t.numel() > 0) {
      const int64_t bad = (~at::isfinite(t)).sum().item<int64_t>();
      if (bad > 0)
        fail(where + " holds " + std::to_string(bad) + " non-finite value" + (bad == 1 ? "" : "s") +
             " (NaN or infinity): the model was saved after it diverged");
    }
    return dtype == at::kBool ? t.to(at::kBool) : t;
  }
};

}  // namespace

void save_checkpoint(const std::string& path, const Graph& graph_in, const std::string& recipe, const std::string& metrics) {
  std::lock_guard<std::mutex> hdf5_lock(hdf5::library_mutex());
  hdf5::SilenceErrors quiet;
  // Quantized weights are stored as their integer codes and scales, never as floats (and codes of
  // an already packed node are written as they are, never re-quantized).
  const Graph graph = quantize::pack_graph(graph_in);
  const std::string dir = parent_directory(path);
  if (!is_directory(dir)) throw Error("cannot write checkpoint " + path + ": directory " + dir + " does not exist");
  try {
    write_atomic(path, [&](const std::string& tmp) {
      // HDF5 1.10 object formats: compact link storage, small object headers, a single-chunk index
      // for the deflated graph and tensor index instead of a B-tree, and checksummed metadata. About
      // 5 kB less per file than the 1.8 formats (ResNet-20 BNN: 57 kB instead of 63 kB); h5py and any
      // HDF5 ≥ 1.10 read it.
      H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
      H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110);
      H5Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
      if (!file.valid()) throw Error("cannot write checkpoint " + path + ": cannot create " + tmp + " (permission denied or disk full?)");
      write_attr_string(file.get(), "format", "whittle.checkpoint");
      write_attr_int(file.get(), "format_version", kCheckpointFormatVersion);
      write_attr_string(file.get(), "whittle_version", version());
      write_attr_string(file.get(), "torch_version", torch_version());
      write_attr_string(file.get(), "created", utc_now());
      write_compressed_text(file.get(), "graph", graph_to_json(graph));
      if (!recipe.empty()) write_string_dataset(file.get(), "recipe", recipe);
      if (!metrics.empty()) write_string_dataset(file.get(), "metrics", metrics);
      TensorBlob blob;
      for (const auto& n : graph.nodes()) {
        for (const auto& kv : n.params)
          if (kv.second.defined()) blob.add(n, kv.first, kv.second, "param");
        for (const auto& kv : n.buffers)
          if (kv.second.defined()) blob.add(n, kv.first, kv.second, "buffer");
      }
      blob.write(file.get());
      if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw Error("cannot write checkpoint " + path + ": flush failed (disk full?)");
      if (!file.close()) throw Error("cannot write checkpoint " + path + ": close failed (disk full?)");
    });
  } catch (const Error& e) {
    if (std::string(e.what()).rfind("cannot write checkpoint", 0) == 0) throw;
    throw Error("cannot write checkpoint " + path + ": " + write_failure_reason(e.what(), path));
  }
}

namespace {
// `r.path` opened read-only as HDF5, or r.fail naming why not (the caller holds the HDF5 lock).
H5Id open_for_reading(const Reader& r) {
  if (!is_regular_file(r.path)) r.fail("no such file");
  if (!is_hdf5_file(r.path)) r.fail("not an HDF5 file (no HDF5 signature): not a whittle checkpoint");
  H5Id file(H5Fopen(r.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) r.fail("cannot open as HDF5 (the file is truncated or damaged)");
  return file;
}
}  // namespace

std::vector<std::string> checkpoint_tensor_names(const std::string& path) {
  std::lock_guard<std::mutex> hdf5_lock(hdf5::library_mutex());
  hdf5::SilenceErrors quiet;
  Reader r;
  r.path = path;
  const H5Id file = open_for_reading(r);
  H5Id group(H5Gopen2(file.get(), "tensors", H5P_DEFAULT), H5Gclose);
  if (!group.valid()) r.fail("missing group 'tensors'");
  std::vector<std::string> names;
  try {
    for (const auto& e : nlohmann::json::parse(r.read_text(group.get(), "index")))
      names.push_back(e.at("node").get<std::string>() + "." + e.at("name").get<std::string>());
  } catch (const nlohmann::json::exception& ex) {
    r.fail(std::string("malformed tensor index (") + ex.what() + ")");
  }
  return names;
}

std::string checkpoint_recipe(const std::string& path) {
  std::lock_guard<std::mutex> hdf5_lock(hdf5::library_mutex());
  hdf5::SilenceErrors quiet;
  Reader r;
  r.path = path;
  const H5Id file = open_for_reading(r);
  return r.read_string(file.get(), "recipe", false);
}

// A checkpoint may name the ops and transforms of quantize/ and fuse/; these references make
// sure both modules (and so their WHITTLE_REGISTER_MODULE registrations) are linked into every
// program that loads checkpoints.
[[maybe_unused]] void (*const kCheckpointModules[])() = {&quantize::register_all, &fuse::register_all};

Checkpoint load_checkpoint(const std::string& path) {
  std::lock_guard<std::mutex> hdf5_lock(hdf5::library_mutex());
  hdf5::SilenceErrors quiet;
  Reader r;
  r.path = path;
  if (!path_exists(path)) r.fail("no such file");
  if (!is_regular_file(path)) r.fail("not a regular file");
  if (!is_hdf5_file(path)) r.fail("not an HDF5 file (no HDF5 signature): not a whittle checkpoint");
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) r.fail("cannot open as HDF5 (the file is truncated or damaged)");
  if (!r.has_attr(file.get(), "format")) r.fail("an HDF5 file without whittle's format attribute: not a whittle checkpoint");
  {
    std::string format;
    try {
      format = r.read_attr_string(file.get(), "format", "file");
    } catch (const Error&) {
      r.fail("an HDF5 file whose format attribute is not whittle's: not a whittle checkpoint");
    }
    if (format != "whittle.checkpoint")
      r.fail("an HDF5 file of format '" + format + "', not a whittle checkpoint (format 'whittle.checkpoint')");
  }
  Checkpoint ck;
  ck.format_version = static_cast<int>(r.read_attr_int(file.get(), "format_version", "file"));
  if (ck.format_version > kCheckpointFormatVersion)
    r.fail("checkpoint format version " + std::to_string(ck.format_version) + " is newer than this whittle reads (" +
           std::to_string(kCheckpointFormatVersion) + "); upgrade whittle");
  if (ck.format_version < kCheckpointOldestReadableVersion)
    r.fail("checkpoint format version " + std::to_string(ck.format_version) +
           " was written by a development version of whittle with another layout; write it again");
  ck.whittle_version = r.read_attr_string(file.get(), "whittle_version", "file");
  ck.torch_version = r.read_attr_string(file.get(), "torch_version", "file");
  ck.created = r.read_attr_string(file.get(), "created", "file");
  const std::string structure = r.read_text(file.get(), "graph");
  ck.recipe = r.read_string(file.get(), "recipe", false);
  ck.metrics = r.read_string(file.get(), "metrics", false);
  r.read_tensors(file.get());
  TensorSource source = [&](const std::string& node, TensorRole role, const std::string& name, const Shape& shape,
                            at::ScalarType dtype) { return r.read_tensor(node, role, name, shape, dtype); };
  ck.graph = graph_from_json(structure, source, path);
  r.check_packed_codes(ck.graph);
  // Every stored tensor belongs to the graph: one it does not read was not written for it.
  for (const auto& [key, st] : r.index)
    if (!r.used.count(key))
      r.fail("the tensor index has an entry for tensor '" + key.first + "." + key.second +
             "', which the graph does not have (file damaged)");
  return ck;
}

}  // namespace whittle
