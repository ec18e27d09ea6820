#pragma once
// Launch geometry shared by whittle's torch-free CUDA kernels (kernels/kernels_cuda.cu,
// quantize/quantize_cuda.cu) and by the host runs of their loops in tests: blocks of
// kThreadsPerBlock threads, one thread an element (or output word) in grid-stride loops, and a cap
// on the blocks of a launch, which tests lower so that every loop takes several trips. No LibTorch,
// no CUDA runtime: nvcc compiles it for the device, any C++ compiler for the host.

#include <cstdint>

#ifndef WHITTLE_HD
#if defined(__CUDACC__)
#define WHITTLE_HD __host__ __device__ __forceinline__
#else
#define WHITTLE_HD inline
#endif
#endif

namespace whittle::cuda_grid {

/// Threads a block in every launch: a multiple of 32, so each warp covers 32 consecutive elements
/// starting at a multiple of 32.
constexpr int kThreadsPerBlock = 256;

/// CUDA's largest x grid dimension, 2^31 − 1.
constexpr unsigned kMaxGridBlocks = 2147483647u;

/// The grid-stride loops: thread `thread` of block `block` (of `blocks` blocks of `threads`) takes
/// elements first_element, first_element + grid_stride, …; a warp-synchronous loop runs every lane
/// over the trips of its warp's first element (warp_first_element), so all lanes join each ballot.
WHITTLE_HD int64_t first_element(int64_t block, int64_t threads, int64_t thread) { return block * threads + thread; }
WHITTLE_HD int64_t warp_first_element(int64_t block, int64_t threads, int64_t thread) {
  return block * threads + (thread - (thread & 31));
}
WHITTLE_HD int64_t grid_stride(int64_t blocks, int64_t threads) { return blocks * threads; }

/// Blocks of kThreadsPerBlock for n elements: at least 1, at most `max_blocks`.
inline unsigned blocks_for(int64_t n, unsigned max_blocks) {
  const int64_t b = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(b < 1 ? 1 : (b < static_cast<int64_t>(max_blocks) ? b : max_blocks));
}

/// A cap asked for by a test: `limit`, or `fallback` for 0 or anything above kMaxGridBlocks.
inline unsigned grid_limit(unsigned limit, unsigned fallback) {
  return (limit == 0 || limit > kMaxGridBlocks) ? fallback : limit;
}

}  // namespace whittle::cuda_grid
