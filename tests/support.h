#pragma once
// Shared test support: a seeded fixture, tensor comparison reporting the worst element, paths.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>

#include "core/error.h"

namespace whittle::test {

/// Seeds LibTorch's generator (CPU and CUDA) with 0 before every test, so each test sees the same
/// random tensors whatever order tests run in.
class SeededTest : public ::testing::Test {
 protected:
  void SetUp() override { at::manual_seed(0); }
};

/// Compares `actual` with `expected` elementwise: |a − e| ≤ atol + rtol·|e| (as torch.allclose).
/// On failure reports the shapes, the worst element (largest excess over its tolerance), its
/// flat index, both values, and the atol/rtol used.
inline ::testing::AssertionResult all_close(const at::Tensor& actual, const at::Tensor& expected, double atol,
                                            double rtol) {
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream os;
    os << "shape mismatch: actual " << actual.sizes() << " vs expected " << expected.sizes();
    return ::testing::AssertionFailure() << os.str();
  }
  at::Tensor a = actual.detach().to(at::kCPU, at::kDouble).flatten();
  at::Tensor e = expected.detach().to(at::kCPU, at::kDouble).flatten();
  if (a.numel() == 0) return ::testing::AssertionSuccess();
  at::Tensor diff = (a - e).abs();
  at::Tensor excess = diff - (atol + rtol * e.abs());
  // NaN in either tensor counts as a failure unless both are NaN at the same place.
  at::Tensor both_nan = a.isnan() & e.isnan();
  excess = at::where(both_nan, at::full_like(excess, -1.0), at::nan_to_num(excess, 1e300, 1e300, 1e300));
  int64_t worst = excess.argmax().item<int64_t>();
  if (excess[worst].item<double>() <= 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << "tensors differ (atol " << atol << ", rtol " << rtol << "): worst element at flat index " << worst << " of "
     << a.numel() << " (shape " << actual.sizes() << "): actual " << a[worst].item<double>() << ", expected "
     << e[worst].item<double>() << ", |diff| " << diff[worst].item<double>() << "; max |diff| overall "
     << at::nan_to_num(diff, 1e300).max().item<double>();
  return ::testing::AssertionFailure() << os.str();
}

/// The message of the whittle::Error of kind kUsage that calling `f` throws. Records a test
/// failure and returns "" when `f` returns normally or throws another kind.
template <class F>
std::string usage_error_message(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.kind() == ErrorKind::kUsage ? e.what() : "";
  }
  ADD_FAILURE() << "no usage error was thrown";
  return "";
}

/// The project's source directory (for recipes/ and data/), the build directory (for generated
/// test data) and the Python interpreter of the reference checks (WHITTLE_PYTHON): absolute paths,
/// defined in the build's generated test_paths.cpp (tests/test_paths.cpp.in), so that no test
/// source holds a path of its clone.
std::string source_dir();
std::string binary_dir();
std::string python_path();

}  // namespace whittle::test

/// Skips the current test when LibTorch sees no CUDA device.
#define WHITTLE_REQUIRE_CUDA()                                        \
  do {                                                                \
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device available"; \
  } while (0)
