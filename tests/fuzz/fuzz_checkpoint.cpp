// libFuzzer target: the checkpoint reader (export/checkpoint.h) on arbitrary bytes. Both entry
// points that read a file: load_checkpoint (structure, index, every tensor's CRC-32) and
// checkpoint_tensor_names (the index alone).
//
// Byte mutations rarely get past HDF5's structure and the CRC-32 of the graph and the tensor index:
// in 600 s they found neither a duplicated index entry nor a graph input of 2^61 pixels. So most
// mutations here are structure-aware (LLVMFuzzerCustomMutator): the graph JSON or the tensor index
// of a checkpoint is parsed, one value in it edited (a number made extreme, an array entry
// duplicated or dropped, a string changed, a key dropped) and written back as whittle writes it,
// with its CRC-32, so that each mutant reaches the reader's checks behind the format.
#include <hdf5.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "export/checkpoint.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using nlohmann::json;

// The uint8 text dataset `name` of `file` (the graph, the tensor index), or nullopt.
std::optional<std::string> read_text(hid_t file, const char* name) {
  if (H5Lexists(file, "tensors", H5P_DEFAULT) <= 0 || H5Lexists(file, name, H5P_DEFAULT) <= 0) return std::nullopt;
  const hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
  if (ds < 0) return std::nullopt;
  const hid_t space = H5Dget_space(ds);
  hsize_t n = 0;
  std::optional<std::string> out;
  if (space >= 0 && H5Sget_simple_extent_ndims(space) == 1 && H5Sget_simple_extent_dims(space, &n, nullptr) == 1 &&
      n > 0 && n < (1u << 24)) {
    std::string s(n, '\0');
    if (H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()) >= 0) out = s.substr(0, std::strlen(s.c_str()));
  }
  if (space >= 0) H5Sclose(space);
  H5Dclose(ds);
  return out;
}

// Replaces dataset `name` with `text` as whittle writes it: 1-D uint8, deflated, crc32 attribute.
bool write_text(hid_t file, const char* name, const std::string& text) {
  if (H5Ldelete(file, name, H5P_DEFAULT) < 0) return false;
  const hsize_t n = text.size();
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &n);
  H5Pset_deflate(dcpl, 1);
  const hid_t ds = H5Dcreate2(file, name, H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  bool ok = ds >= 0 && H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()) >= 0;
  if (ok) {
    const int64_t crc = static_cast<int64_t>(crc32(0, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
    const hid_t aspace = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(ds, "crc32", H5T_STD_I64LE, aspace, H5P_DEFAULT, H5P_DEFAULT);
    ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_INT64, &crc) >= 0;
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(aspace);
  }
  if (ds >= 0) H5Dclose(ds);
  H5Pclose(dcpl);
  H5Sclose(space);
  return ok;
}

// Every value of `j`, by pointer, for picking one to edit.
void collect(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object())
    for (const auto& [k, v] : j.items()) collect(v, at / k, out);
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) collect(j[i], at / i, out);
}

// One edit of one value of `doc`.
void edit(json& doc, std::mt19937& rng) {
  std::vector<json::json_pointer> all;
  collect(doc, json::json_pointer(), all);
  json& v = doc[all[rng() % all.size()]];
  static const int64_t extremes[] = {0, -1, 1, 2, 3, 255, int64_t{1} << 31, int64_t{1} << 40, (int64_t{1} << 40) + 1,
                                     (int64_t{1} << 61) + 28, std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min()};
  if (v.is_number()) {
    switch (rng() % 3) {
      case 0: v = extremes[rng() % (sizeof extremes / sizeof extremes[0])]; break;
      case 1:  // one more (wrapping, as the int64 limits are among the values above), or twice a float
        if (v.is_number_unsigned()) v = v.get<uint64_t>() + 1;
        else if (v.is_number_integer()) v = static_cast<int64_t>(static_cast<uint64_t>(v.get<int64_t>()) + 1);
        else v = v.get<double>() * 2;
        break;
      default: v = std::numeric_limits<double>::quiet_NaN(); break;
    }
  } else if (v.is_array() && !v.empty()) {
    const size_t i = rng() % v.size();
    if (rng() % 2) v.push_back(v[i]);  // duplicated (an index entry twice, a node twice)
    else v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
  } else if (v.is_object() && !v.empty()) {
    auto it = v.begin();
    std::advance(it, rng() % v.size());
    if (rng() % 2) v.erase(it);
    else v[it.key() + "_"] = it.value();  // an unknown key beside the known one
  } else if (v.is_string()) {
    std::string s = v.get<std::string>();
    v = rng() % 2 || s.empty() ? s + "x" : s.substr(0, s.size() - 1);
  }
}

// A copy of the checkpoint at `path` with one edit to its graph or tensor index, or nullopt when it
// is not a checkpoint whose texts can be read.
std::optional<std::string> edited_checkpoint(const std::string& path, std::mt19937& rng) {
  H5E_auto2_t func = nullptr;
  void* data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &func, &data);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::optional<std::string> out;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file >= 0) {
    const char* name = rng() % 2 ? "graph" : "tensors/index";
    if (std::optional<std::string> text = read_text(file, name)) {
      json doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (!doc.is_discarded()) {
        for (unsigned edits = 1 + rng() % 2; edits > 0; --edits) edit(doc, rng);
        if (write_text(file, name, doc.dump())) out = std::string();
      }
    }
    if (H5Fclose(file) < 0) out.reset();
  }
  H5Eset_auto2(H5E_DEFAULT, func, data);
  if (!out) return std::nullopt;
  std::ifstream f(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << f.rdbuf();
  return bytes.str();
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::mt19937 rng(seed);
  if (rng() % 4 != 0) {
    const std::string path = whittle::fuzz::write_input(data, size, "mutate.h5");
    const std::optional<std::string> mutant = edited_checkpoint(path, rng);
    if (mutant && !mutant->empty() && mutant->size() <= max_size) {
      std::memcpy(data, mutant->data(), mutant->size());
      return mutant->size();
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = whittle::fuzz::write_input(data, size, "input.h5");
  whittle::fuzz::expect_named_errors([&] { whittle::load_checkpoint(path); });
  whittle::fuzz::expect_named_errors([&] { whittle::checkpoint_tensor_names(path); });
  return 0;
}
