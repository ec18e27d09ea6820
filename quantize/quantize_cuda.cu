// CUDA kernels of the fused quantizers (quantize/quantize_cuda.h): grid-stride loops over the
// per-element bodies of quantize_cuda_bodies.h. Every product, quotient and sum
// is rounded on its own (__fmul_rn and friends, and -fmad=false for anything else), as in ATen's
// separate element-wise kernels, so that the fused kernels give the bits of the ATen-op forms of
// quantize/quantizers.cpp on the GPU. One difference from the CPU: ATen's CUDA division by a
// scalar multiplies by the scalar's float reciprocal (BinaryDivTrueKernel.cu), so these kernels do
// too where the ATen-op form divides by a scalar (the clip level, the number of levels).

#include <cuda_runtime.h>

#include <cstdint>

#include "quantize/quantize_cuda.h"

namespace whittle::quantize::detail {
namespace {

using namespace cuda_body;

using cuda_grid::first_element;
using cuda_grid::grid_stride;
using cuda_grid::kThreadsPerBlock;
unsigned max_blocks = cuda_grid::kMaxGridBlocks;  // set_quantize_cuda_grid_limit

unsigned blocks_for(int64_t n) { return cuda_grid::blocks_for(n, max_blocks); }

// y[i] = op.value(x[i]) and mask bit i = op.pass(x[i]) for i < n, one thread an element, the 32
// bits of a warp gathered by __ballot_sync and stored by its first lane. Every lane of a warp
// takes the trips of the warp's first element, so all join every ballot.
template <class Op>
__global__ void masked_quantizer_kernel(const float* __restrict__ x, float* __restrict__ y, uint8_t* __restrict__ mask,
                                        int64_t n, Op op) {
  const int64_t stride = grid_stride(gridDim.x, blockDim.x);
  const int64_t lane = threadIdx.x & 31;
  for (int64_t base = cuda_grid::warp_first_element(blockIdx.x, blockDim.x, threadIdx.x); base < n; base += stride) {
    const bool pass = masked_lane(x, y, n, base + lane, op);
    store_warp_mask(mask, lane, base, n, __ballot_sync(0xffffffffu, pass));
  }
}

#define WHITTLE_QUANTIZE_GRID_LOOP(i, n)                                                      \
  for (int64_t i = first_element(blockIdx.x, blockDim.x, threadIdx.x); i < (n); i += grid_stride(gridDim.x, blockDim.x))

__global__ void mask_multiply_kernel(const float* __restrict__ g, const uint8_t* __restrict__ mask,
                                     float* __restrict__ dx, int64_t n) {
  WHITTLE_QUANTIZE_GRID_LOOP(i, n) dx[i] = mask_multiply_value(g, mask, i);
}

__global__ void dorefa_weight_values_kernel(const float* __restrict__ t, const float* __restrict__ m,
                                            float* __restrict__ dst, ChannelView v, float levels, float inv_levels) {
  WHITTLE_QUANTIZE_GRID_LOOP(i, v.outer * v.channels * v.inner) dst[i] = dorefa_weight_value(t, m, v, levels, inv_levels, i);
}

__global__ void dorefa_weight_grad_kernel(const float* __restrict__ g, const float* __restrict__ t,
                                          const float* __restrict__ m, float* __restrict__ dst, ChannelView v) {
  WHITTLE_QUANTIZE_GRID_LOOP(i, v.outer * v.channels * v.inner) dst[i] = dorefa_weight_grad_value(g, t, m, v, i);
}

__global__ void ternary_values_kernel(const float* __restrict__ w, const float* __restrict__ delta,
                                      const float* __restrict__ alpha, float* __restrict__ dst, ChannelView v,
                                      bool per_channel_delta, bool per_channel_alpha) {
  WHITTLE_QUANTIZE_GRID_LOOP(i, v.outer * v.channels * v.inner)
  dst[i] = ternary_value(w, delta, alpha, v, per_channel_delta, per_channel_alpha, i);
}

__global__ void lsq_kernel(const float* __restrict__ x, const float* __restrict__ steps, const float* __restrict__ offset,
                           float* __restrict__ y, ChannelView v, float lo, float hi) {
  WHITTLE_QUANTIZE_GRID_LOOP(i, v.outer * v.channels * v.inner) y[i] = lsq_value(x, steps, offset, v, lo, hi, i);
}

__global__ void lsq_backward_kernel(const float* __restrict__ g, const float* __restrict__ x,
                                    const float* __restrict__ steps, const float* __restrict__ offset,
                                    float* __restrict__ dx, float* __restrict__ step_terms,
                                    float* __restrict__ offset_terms, ChannelView v, float lo, float hi) {
  WHITTLE_QUANTIZE_GRID_LOOP(i, v.outer * v.channels * v.inner) {
    const LsqGradTerms t = lsq_grad_terms(g, x, steps, offset, v, lo, hi, i);
    dx[i] = t.input;
    step_terms[i] = t.step;
    if (offset_terms != nullptr) offset_terms[i] = t.offset;
  }
}

__global__ void pact_kernel(const float* __restrict__ x, const float* __restrict__ alpha, const float* __restrict__ step,
                            float* __restrict__ y, int64_t n) {
  WHITTLE_QUANTIZE_GRID_LOOP(i, n) y[i] = pact_value(x, alpha, step, i);
}

__global__ void pact_backward_kernel(const float* __restrict__ g, const float* __restrict__ x,
                                     const float* __restrict__ alpha, float* __restrict__ dx,
                                     float* __restrict__ alpha_terms, int64_t n, bool after_relu) {
  WHITTLE_QUANTIZE_GRID_LOOP(i, n) {
    const PactGradTerms t = pact_grad_terms(g, x, alpha, after_relu, i);
    dx[i] = t.input;
    alpha_terms[i] = t.alpha;
  }
}

#undef WHITTLE_QUANTIZE_GRID_LOOP

int launched() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

int dorefa_activation_cuda(const float* x, float* y, uint8_t* mask, int64_t n, float clip, int bits, bool after_relu,
                           void* stream) {
  if (n <= 0) return 0;
  const DoReFaActivationOp op = dorefa_activation_op(clip, bits, after_relu);
  masked_quantizer_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(x, y, mask, n, op);
  return launched();
}

int sign_cuda(const float* x, float* y, uint8_t* mask, int64_t n, void* stream) {
  if (n <= 0) return 0;
  masked_quantizer_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(x, y, mask, n, SignOp{});
  return launched();
}

int mask_multiply_cuda(const float* g, const uint8_t* mask, float* dx, int64_t n, void* stream) {
  if (n <= 0) return 0;
  mask_multiply_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(g, mask, dx, n);
  return launched();
}

int dorefa_weight_values_cuda(const float* t, const float* m, float* dst, CudaChannelView v, int bits, void* stream) {
  const float levels = dorefa_levels(bits);
  const int64_t n = v.outer * v.channels * v.inner;
  if (n <= 0) return 0;
  dorefa_weight_values_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(t, m, dst, v, levels,
                                                                                                 1.0f / levels);
  return launched();
}

int dorefa_weight_grad_cuda(const float* g, const float* t, const float* m, float* dst, CudaChannelView v, void* stream) {
  const int64_t n = v.outer * v.channels * v.inner;
  if (n <= 0) return 0;
  dorefa_weight_grad_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(g, t, m, dst, v);
  return launched();
}

int ternary_values_cuda(const float* w, const float* delta, const float* alpha, float* dst, CudaChannelView v,
                        bool per_channel_delta, bool per_channel_alpha, void* stream) {
  const int64_t n = v.outer * v.channels * v.inner;
  if (n <= 0) return 0;
  ternary_values_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      w, delta, alpha, dst, v, per_channel_delta, per_channel_alpha);
  return launched();
}

int lsq_cuda(const float* x, const float* steps, const float* offset, float* y, CudaChannelView v, float lo, float hi,
             void* stream) {
  const int64_t n = v.outer * v.channels * v.inner;
  if (n <= 0) return 0;
  lsq_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(x, steps, offset, y, v, lo, hi);
  return launched();
}

int lsq_backward_cuda(const float* g, const float* x, const float* steps, const float* offset, float* dx,
                      float* step_terms, float* offset_terms, CudaChannelView v, float lo, float hi, void* stream) {
  const int64_t n = v.outer * v.channels * v.inner;
  if (n <= 0) return 0;
  lsq_backward_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      g, x, steps, offset, dx, step_terms, offset_terms, v, lo, hi);
  return launched();
}

int pact_cuda(const float* x, const float* alpha, const float* step, float* y, int64_t n, void* stream) {
  if (n <= 0) return 0;
  pact_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(x, alpha, step, y, n);
  return launched();
}

int pact_backward_cuda(const float* g, const float* x, const float* alpha, float* dx, float* alpha_terms, int64_t n,
                       bool after_relu, void* stream) {
  if (n <= 0) return 0;
  pact_backward_kernel<<<blocks_for(n), kThreadsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(g, x, alpha, dx,
                                                                                          alpha_terms, n, after_relu);
  return launched();
}

unsigned set_quantize_cuda_grid_limit(unsigned limit) {
  const unsigned previous = max_blocks;
  max_blocks = cuda_grid::grid_limit(limit, cuda_grid::kMaxGridBlocks);
  return previous;
}

const char* quantize_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace whittle::quantize::detail
