#pragma once
// The largest tensor shape whittle accepts from a user (--input-shape, model.input_shape) or a file
// (a checkpoint's declared input, every shape inferred from it), and checked arithmetic on shapes.

#include <cstdint>
#include <initializer_list>
#include <optional>
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

/// Whether every dimension of `dims` is ≥ 0 and their product at most kMaxShapeElements (an empty
/// tensor, a 0 dimension, is within it), computed without overflowing. For shapes read from files
/// and inferred from them, where one dimension of 2^61 would wrap the element and MAC counts.
inline bool elements_within_limit(const std::vector<int64_t>& dims) {
  for (int64_t d : dims)
    if (d < 0) return false;
  for (int64_t d : dims)
    if (d == 0) return true;
  return shape_within_limit(dims);
}

/// What is wrong with `dims` for elements_within_limit ("a negative dimension", "more than 2^40
/// elements"), or "" when nothing is.
inline const char* shape_limit_problem(const std::vector<int64_t>& dims) {
  for (int64_t d : dims)
    if (d < 0) return "a negative dimension";
  return elements_within_limit(dims) ? "" : "more than 2^40 elements";
}

/// The product of `factors` (each ≥ 0), or nullopt when it does not fit int64.
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (f < 0 || __builtin_mul_overflow(p, f, &p)) return std::nullopt;
  return p;
}

}  // namespace whittle
