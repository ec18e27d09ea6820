#pragma once
// Integers read from JSON that came from a file (a checkpoint's graph structure and tensor index, a
// training state, a run's report): each value is checked before it is converted. A JSON parser
// reads an integer literal too long for 64 bits, or 1e300, as a float, and converting that float
// to an integer type is undefined behaviour in C++; an unsigned value past the target's range
// would wrap around. These helpers throw whittle::Error naming `where` instead.
//
// Header-only, templated on the JSON type (nlohmann::json and nlohmann::ordered_json), so that
// core/ itself does not depend on a JSON library.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace whittle {

/// `v`, shown in an error message: its JSON text cut to 40 characters.
template <class Json>
std::string json_shown(const Json& v) {
  std::string t = v.dump();
  return t.size() > 40 ? t.substr(0, 37) + "..." : t;
}

/// `v` as an int64: a JSON integer within int64's range. Throws whittle::Error naming `where` for a
/// float, a non-number or an unsigned value past INT64_MAX.
template <class Json>
int64_t json_int64(const Json& v, const std::string& where) {
  if (v.is_number_integer() &&
      !(v.is_number_unsigned() && v.template get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
    return v.template get<int64_t>();
  throw Error(where + ": expected an integer in the 64-bit range, got " + json_shown(v));
}

/// `v` as a uint64 no larger than `max`: a JSON integer in [0, max]. Throws whittle::Error naming
/// `where` otherwise.
template <class Json>
uint64_t json_uint64(const Json& v, const std::string& where,
                     uint64_t max = std::numeric_limits<uint64_t>::max()) {
  if (v.is_number_unsigned() && v.template get<uint64_t>() <= max) return v.template get<uint64_t>();
  if (v.is_number_integer() && v.template get<int64_t>() >= 0 && static_cast<uint64_t>(v.template get<int64_t>()) <= max)
    return static_cast<uint64_t>(v.template get<int64_t>());
  throw Error(where + ": expected an integer in [0, " + std::to_string(max) + "], got " + json_shown(v));
}

/// `v` as a list of int64 (each as json_int64). Throws whittle::Error naming `where` for anything
/// else.
template <class Json>
std::vector<int64_t> json_int64s(const Json& v, const std::string& where) {
  if (!v.is_array()) throw Error(where + ": expected a list of integers, got " + json_shown(v));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const auto& e : v) out.push_back(json_int64(e, where));
  return out;
}

}  // namespace whittle
