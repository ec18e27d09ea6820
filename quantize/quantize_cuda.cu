// CUDA kernels of the fused quantizers (quantize/quantize_cuda.h). Every product, quotient and sum
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

constexpr int kThreads = 256;  // a multiple of 32: every warp covers 32 elements starting at a multiple of 32

// Blocks for n elements, one thread an element; the kernels loop with a grid stride past 2^31 − 1.
unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 2147483647 ? b : 2147483647);
}

// std::min(std::max(x, 0), c) with std's NaN behaviour (the first argument wins a comparison with
// NaN), not fminf/fmaxf's (which drop the NaN).
__device__ __forceinline__ float clip_like_std(float x, float c) {
  const float t = (x < 0.0f) ? 0.0f : x;
  return (c < t) ? c : t;
}

// As the ATen-op form on CUDA: clamp(x, 0, c) · (1/c), then round(· n) · (1/n), then · c.
__device__ __forceinline__ float dorefa_value(float x, float clip, float inv_clip, float levels, float inv_levels,
                                              bool unit_clip) {
  float t = clip_like_std(x, clip);
  if (!unit_clip) t = __fmul_rn(t, inv_clip);
  float q = __fmul_rn(rintf(__fmul_rn(t, levels)), inv_levels);
  if (!unit_clip) q = __fmul_rn(q, clip);
  return q;
}

// Writes the 32 mask bits of one warp (bit k: element base + k) as the bytes base/8 .. base/8 + 3
// that exist (n elements: ⌈n/8⌉ bytes; bits past n are 0 because the predicate was false there).
__device__ __forceinline__ void write_mask_word(uint8_t* mask, int64_t base, int64_t n, unsigned bits) {
  if ((threadIdx.x & 31) != 0) return;
  const int64_t bytes = (n + 7) / 8;
  for (int b = 0; b < 4; ++b) {
    const int64_t at = base / 8 + b;
    if (at < bytes) mask[at] = static_cast<uint8_t>(bits >> (8 * b));
  }
}

// y[i] = op.value(x[i]) and mask bit i = op.pass(x[i]) for i < n, one thread an element. The loop
// bound is the warp's first element, so every lane of a warp takes the same trips and joins every
// ballot.
template <class Op>
__global__ void masked_quantizer_kernel(const float* __restrict__ x, float* __restrict__ y, uint8_t* __restrict__ mask,
                                        int64_t n, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t lane = threadIdx.x & 31;
  for (int64_t warp_base = static_cast<int64_t>(blockIdx.x) * blockDim.x + (threadIdx.x - lane); warp_base < n;
       warp_base += stride) {
    const int64_t i = warp_base + lane;
    bool pass = false;
    if (i < n) {
      const float v = x[i];
      y[i] = op.value(v);
      pass = op.pass(v);
    }
    const unsigned bits = __ballot_sync(0xffffffffu, pass);
    if (mask) write_mask_word(mask, warp_base, n, bits);
  }
}

// DoReFa activation; the gradient passes on [0, clip], or (0, clip] after a folded ReLU.
struct DoReFaActivationOp {
  float clip, inv_clip, levels, inv_levels;
  bool unit_clip, after_relu;
  __device__ float value(float v) const { return dorefa_value(v, clip, inv_clip, levels, inv_levels, unit_clip); }
  __device__ bool pass(float v) const { return (after_relu ? v > 0.0f : v >= 0.0f) && v <= clip; }
};

// BNN sign (sign(0) = +1, NaN → −1); the gradient passes where |x| ≤ 1.
struct SignOp {
  __device__ float value(float v) const { return v >= 0.0f ? 1.0f : -1.0f; }
  __device__ bool pass(float v) const { return fabsf(v) <= 1.0f; }
};

__global__ void mask_multiply_kernel(const float* __restrict__ g, const uint8_t* __restrict__ mask,
                                     float* __restrict__ dx, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = __fmul_rn(g[i], ((mask[i / 8] >> (i % 8)) & 1u) ? 1.0f : 0.0f);
}

__device__ __forceinline__ int64_t channel_of(int64_t i, const CudaChannelView& v) { return (i / v.inner) % v.channels; }

__global__ void dorefa_weight_values_kernel(const float* __restrict__ t, const float* __restrict__ m,
                                            float* __restrict__ dst, CudaChannelView v, float levels,
                                            float inv_levels) {
  const int64_t n = v.outer * v.channels * v.inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float m2 = __fmul_rn(m[v.per_channel ? channel_of(i, v) : 0], 2.0f);
    float code = rintf(__fmul_rn(__fadd_rn(__fdiv_rn(t[i], m2), 0.5f), levels));
    code = (code < 0.0f) ? 0.0f : code;  // std::max(code, 0), then std::min(·, levels)
    code = (levels < code) ? levels : code;
    // decode_weight: code / n · 2 − 1, the division by the scalar n as ATen's CUDA kernel does it
    dst[i] = __fsub_rn(__fmul_rn(__fmul_rn(code, inv_levels), 2.0f), 1.0f);
  }
}

__global__ void dorefa_weight_grad_kernel(const float* __restrict__ g, const float* __restrict__ t,
                                          const float* __restrict__ m, float* __restrict__ dst, CudaChannelView v) {
  const int64_t n = v.outer * v.channels * v.inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float mc = m[v.per_channel ? channel_of(i, v) : 0];
    dst[i] = __fdiv_rn(__fmul_rn(g[i], __fsub_rn(1.0f, __fmul_rn(t[i], t[i]))), mc);
  }
}

__global__ void ternary_values_kernel(const float* __restrict__ w, const float* __restrict__ delta,
                                      const float* __restrict__ alpha, float* __restrict__ dst, CudaChannelView v,
                                      bool per_channel_delta, bool per_channel_alpha) {
  const int64_t n = v.outer * v.channels * v.inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t c = channel_of(i, v);
    const float d = delta[per_channel_delta ? c : 0], a = alpha[per_channel_alpha ? c : 0];
    const float code = (w[i] > d ? 1.0f : 0.0f) - (w[i] < -d ? 1.0f : 0.0f) + 1.0f;
    dst[i] = __fmul_rn(code - 1.0f, a);
  }
}

int launched() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

int dorefa_activation_cuda(const float* x, float* y, uint8_t* mask, int64_t n, float clip, float levels, bool unit_clip,
                           bool after_relu, void* stream) {
  if (n <= 0) return 0;
  // The reciprocals as ATen's CUDA division by a scalar forms them: 1 / float(scalar), in float.
  const DoReFaActivationOp op{clip, 1.0f / clip, levels, 1.0f / levels, unit_clip, after_relu};
  masked_quantizer_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, mask, n, op);
  return launched();
}

int sign_cuda(const float* x, float* y, uint8_t* mask, int64_t n, void* stream) {
  if (n <= 0) return 0;
  masked_quantizer_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, mask, n, SignOp{});
  return launched();
}

int mask_multiply_cuda(const float* g, const uint8_t* mask, float* dx, int64_t n, void* stream) {
  if (n <= 0) return 0;
  mask_multiply_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(g, mask, dx, n);
  return launched();
}

int dorefa_weight_values_cuda(const float* t, const float* m, float* dst, CudaChannelView v, float levels, void* stream) {
  const int64_t n = v.outer * v.channels * v.inner;
  if (n <= 0) return 0;
  dorefa_weight_values_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(t, m, dst, v, levels,
                                                                                                 1.0f / levels);
  return launched();
}

int dorefa_weight_grad_cuda(const float* g, const float* t, const float* m, float* dst, CudaChannelView v, void* stream) {
  const int64_t n = v.outer * v.channels * v.inner;
  if (n <= 0) return 0;
  dorefa_weight_grad_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(g, t, m, dst, v);
  return launched();
}

int ternary_values_cuda(const float* w, const float* delta, const float* alpha, float* dst, CudaChannelView v,
                        bool per_channel_delta, bool per_channel_alpha, void* stream) {
  const int64_t n = v.outer * v.channels * v.inner;
  if (n <= 0) return 0;
  ternary_values_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      w, delta, alpha, dst, v, per_channel_delta, per_channel_alpha);
  return launched();
}

const char* quantize_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace whittle::quantize::detail
