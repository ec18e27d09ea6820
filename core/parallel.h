#pragma once
// One entry to ATen's intra-op thread pool for whittle's own loops (the bitpacked kernels, the fused
// quantizers).
//
// at::parallel_for is an inline template whose OpenMP region only exists where the including unit
// is compiled with -fopenmp; this unit is (core/CMakeLists.txt), so the loops that call
// parallel_for here spread over at::get_num_threads() threads, in the same OpenMP runtime that
// LibTorch loads.

#include <cstdint>
#include <functional>

namespace whittle {

/// Calls f(b, e) on disjoint ranges covering [begin, end) on ATen's intra-op threads; a range of
/// at most `grain` elements is not split (at::parallel_for's rule). Exceptions from f are
/// rethrown in the caller.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f);

}  // namespace whittle
