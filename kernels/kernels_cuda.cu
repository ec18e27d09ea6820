// CUDA bitpacked kernels (kernels/kernels_cuda.h): one thread per output element or word, each
// running the per-thread body of kernels/cuda_bodies.h (the code the host tests run too), in a
// grid-stride loop. Thread order follows the output's memory order, so that the stores of a warp
// are contiguous; a warp's threads share their weight words (same o) or their input words (same
// position), which the caches serve. Compiled with -fmad=false: the float epilogues round each
// operation as the CPU kernels do.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernels_cuda.h"

namespace whittle::kernels::detail {
namespace {

namespace body = whittle::kernels::cuda_body;

using cuda_grid::kThreadsPerBlock;
constexpr unsigned kDefaultMaxBlocks = 65535u * 16u;  // the grid-stride loops cover the rest
unsigned max_blocks = kDefaultMaxBlocks;              // set_cuda_grid_limit

unsigned blocks_for(int64_t n) { return cuda_grid::blocks_for(n, max_blocks); }

#define WHITTLE_GRID_LOOP(i, n)                                                                 \
  for (int64_t i = cuda_grid::first_element(blockIdx.x, blockDim.x, threadIdx.x); i < (n);     \
       i += cuda_grid::grid_stride(gridDim.x, blockDim.x))

// Output words in [N, HW, Cw] order; thread i → (n, p, k) with k fastest.
__global__ void pack_signs_kernel(const float* __restrict__ x, uint64_t* __restrict__ out, int64_t N, int64_t C,
                                  int64_t HW) {
  const int64_t total = N * HW * ((C + 63) / 64);
  WHITTLE_GRID_LOOP(i, total) {
    const body::PackIndex at = body::pack_index(C, HW, i);
    out[i] = body::pack_sign_word(x, C, HW, at.n, at.p, at.k);
  }
}

__global__ void pack_bitplanes_kernel(const float* __restrict__ x, uint64_t* __restrict__ out, int* bad_code,
                                      int64_t N, int64_t C, int64_t HW, int bits) {
  const int64_t total = N * HW * ((C + 63) / 64);
  WHITTLE_GRID_LOOP(i, total) {
    const body::PackIndex at = body::pack_index(C, HW, i);
    uint64_t words[8];
    if (!body::pack_bitplane_words(x, C, HW, at.n, at.p, at.k, bits, words)) *bad_code = 1;
    for (int j = 0; j < bits; ++j) out[j * total + i] = words[j];
  }
}

// Output words in [N, Ho, Wo, Cw] order.
__global__ void max_pool2d_signs_kernel(const uint64_t* __restrict__ src, uint64_t* __restrict__ out,
                                        body::PoolShape s) {
  const int64_t total = s.N * s.Ho * s.Wo * s.Cw;
  WHITTLE_GRID_LOOP(i, total) {
    const body::WordIndex at = body::word_index(s.Ho, s.Wo, s.Cw, i);
    out[i] = body::pool_sign_word(src, s, at.n, at.h, at.w, at.k);
  }
}

// Outputs in [N, O, Ho, Wo] order: int32 dots (kFloat == false) or floats.
template <bool kFloat>
__global__ void binary_conv2d_kernel(const uint64_t* __restrict__ x, const uint64_t* __restrict__ w,
                                     body::ConvShape s, const float* __restrict__ scale,
                                     const float* __restrict__ bias, void* out) {
  const int64_t total = s.N * s.O * s.Ho * s.Wo;
  WHITTLE_GRID_LOOP(i, total) {
    const body::ConvIndex at = body::conv_index(s, i);
    const int32_t dot = body::binary_dot(x, w, s, at.n, at.o, at.oh, at.ow);
    if (kFloat) static_cast<float*>(out)[i] = body::binary_value(dot, scale, bias, at.o);
    else static_cast<int32_t*>(out)[i] = dot;
  }
}

// Packed threshold signs in [N, Ho, Wo, ⌈O/64⌉] order.
__global__ void binary_conv2d_sign_kernel(const uint64_t* __restrict__ x, const uint64_t* __restrict__ w,
                                          body::ConvShape s, const float* __restrict__ scale,
                                          const float* __restrict__ bias, const float* __restrict__ threshold,
                                          const float* __restrict__ direction, uint64_t* __restrict__ out) {
  const int64_t Ow = (s.O + 63) / 64, total = s.N * s.Ho * s.Wo * Ow;
  WHITTLE_GRID_LOOP(i, total) {
    const body::WordIndex at = body::word_index(s.Ho, s.Wo, Ow, i);
    out[i] = body::binary_threshold_word(x, w, s, scale, bias, threshold, direction, at.n, at.h, at.w, at.k);
  }
}

__global__ void bitplane_conv2d_kernel(const uint64_t* __restrict__ x, int64_t P, body::BitplaneWeight w,
                                       body::ConvShape s, const float* __restrict__ scale,
                                       const float* __restrict__ bias, float* __restrict__ out) {
  const int64_t total = s.N * s.O * s.Ho * s.Wo;
  WHITTLE_GRID_LOOP(i, total) {
    const body::ConvIndex at = body::conv_index(s, i);
    out[i] = body::bitplane_value(x, P, w, s, scale, bias, at.n, at.o, at.oh, at.ow);
  }
}

#undef WHITTLE_GRID_LOOP

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

int pack_signs_cuda(const float* x, uint64_t* out, int64_t N, int64_t C, int64_t HW, void* stream) {
  const int64_t total = N * HW * ((C + 63) / 64);
  if (total == 0) return 0;
  pack_signs_kernel<<<blocks_for(total), kThreadsPerBlock, 0, as_stream(stream)>>>(x, out, N, C, HW);
  return static_cast<int>(cudaGetLastError());
}

int pack_bitplanes_cuda(const float* x, uint64_t* out, int* bad_code, int64_t N, int64_t C, int64_t HW, int bits,
                        void* stream) {
  const int64_t total = N * HW * ((C + 63) / 64);
  if (total == 0) return 0;
  pack_bitplanes_kernel<<<blocks_for(total), kThreadsPerBlock, 0, as_stream(stream)>>>(x, out, bad_code, N, C, HW, bits);
  return static_cast<int>(cudaGetLastError());
}

int max_pool2d_signs_cuda(const uint64_t* src, uint64_t* out, const cuda_body::PoolShape& s, void* stream) {
  const int64_t total = s.N * s.Ho * s.Wo * s.Cw;
  if (total == 0) return 0;
  max_pool2d_signs_kernel<<<blocks_for(total), kThreadsPerBlock, 0, as_stream(stream)>>>(src, out, s);
  return static_cast<int>(cudaGetLastError());
}

int binary_conv2d_cuda(const uint64_t* x, const uint64_t* w, const cuda_body::ConvShape& s, BinaryOutputKind kind,
                       const float* scale, const float* bias, const float* threshold, const float* direction,
                       void* out, void* stream) {
  if (kind == BinaryOutputKind::kSign) {
    const int64_t total = s.N * s.Ho * s.Wo * ((s.O + 63) / 64);
    if (total == 0) return 0;
    binary_conv2d_sign_kernel<<<blocks_for(total), kThreadsPerBlock, 0, as_stream(stream)>>>(
        x, w, s, scale, bias, threshold, direction, static_cast<uint64_t*>(out));
    return static_cast<int>(cudaGetLastError());
  }
  const int64_t total = s.N * s.O * s.Ho * s.Wo;
  if (total == 0) return 0;
  if (kind == BinaryOutputKind::kFloat)
    binary_conv2d_kernel<true><<<blocks_for(total), kThreadsPerBlock, 0, as_stream(stream)>>>(x, w, s, scale, bias, out);
  else
    binary_conv2d_kernel<false><<<blocks_for(total), kThreadsPerBlock, 0, as_stream(stream)>>>(x, w, s, scale, bias, out);
  return static_cast<int>(cudaGetLastError());
}

int bitplane_conv2d_cuda(const uint64_t* x, int64_t P, const cuda_body::BitplaneWeight& w,
                         const cuda_body::ConvShape& s, const float* scale, const float* bias, float* out,
                         void* stream) {
  const int64_t total = s.N * s.O * s.Ho * s.Wo;
  if (total == 0) return 0;
  bitplane_conv2d_kernel<<<blocks_for(total), kThreadsPerBlock, 0, as_stream(stream)>>>(x, P, w, s, scale, bias, out);
  return static_cast<int>(cudaGetLastError());
}

unsigned set_cuda_grid_limit(unsigned limit) {
  const unsigned previous = max_blocks;
  max_blocks = cuda_grid::grid_limit(limit, kDefaultMaxBlocks);
  return previous;
}

const char* kernels_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace whittle::kernels::detail
