#pragma once
// The largest tensor shape whittle accepts from a user (--input-shape, model.input_shape).

#include <cstdint>
#include <vector>

namespace whittle {

/// Elements a user-given shape may hold: 2^40 (4 TiB as float32). Parameter and MAC counts are
/// int64; a larger input could overflow them.
constexpr int64_t kMaxShapeElements = int64_t{1} << 40;

/// Whether the product of `dims` (each ≥ 1) is at most kMaxShapeElements, computed without
/// overflowing.
inline bool shape_within_limit(const std::vector<int64_t>& dims) {
  int64_t elements = 1;
  for (int64_t d : dims) {
    if (d < 1 || d > kMaxShapeElements / elements) return false;
    elements *= d;
  }
  return true;
}

}  // namespace whittle
