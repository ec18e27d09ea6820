#pragma once
// CUDA launchers of the bitpacked kernels (kernels_cuda.cu) on device pointers: plain CUDA, no
// LibTorch. Each maps one GPU thread to one output element or word and runs the per-thread body of
// kernels/cuda_bodies.h there, so it computes exactly what the CPU kernels compute (integer dots;
// float epilogues rounded operation by operation, -fmad=false). Each launcher enqueues its kernel
// on `stream` (a cudaStream_t) and returns the CUDA error code of the launch (0 on success);
// kernels_cuda_error_string names a code. Sizes are those of cuda_bodies.h's shapes.

#include <cstdint>

#include "kernels/cuda_bodies.h"

namespace whittle::kernels::detail {

/// out [N, HW, Cw] words = pack_sign_word of x (contiguous float [N, C, HW]).
int pack_signs_cuda(const float* x, uint64_t* out, int64_t N, int64_t C, int64_t HW, void* stream);

/// out [bits, N, HW, Cw] words = pack_bitplane_words of x (contiguous float [N, C, HW]); sets
/// *bad_code (device memory, zeroed by the caller) to 1 where a code is out of range.
int pack_bitplanes_cuda(const float* x, uint64_t* out, int* bad_code, int64_t N, int64_t C, int64_t HW, int bits,
                        void* stream);

/// out [N, Ho, Wo, Cw] = pool_sign_word of src [N, H, W, Cw].
int max_pool2d_signs_cuda(const uint64_t* src, uint64_t* out, const cuda_body::PoolShape& s, void* stream);

/// What a binary layer writes: int32 dots, floats d·scale + bias, or packed threshold signs.
enum class BinaryOutputKind { kDot, kFloat, kSign };

/// A binary convolution (a linear layer as its 1×1 case) on x [N, H, W, Cw] and weight words
/// [KH·KW·Cw, O]: kDot writes int32 [N, O, Ho, Wo] to `out`, kFloat float [N, O, Ho, Wo] (scale
/// and bias: float [O]), kSign int64 words [N, Ho, Wo, ⌈O/64⌉] (also threshold, direction [O]).
int binary_conv2d_cuda(const uint64_t* x, const uint64_t* w, const cuda_body::ConvShape& s, BinaryOutputKind kind,
                       const float* scale, const float* bias, const float* threshold, const float* direction,
                       void* out, void* stream);

/// A bit-plane convolution: activation planes x [P, N, H, W, Cw], weight planes in `w` (device
/// pointers); float out [N, O, Ho, Wo] = bitplane_value.
int bitplane_conv2d_cuda(const uint64_t* x, int64_t P, const cuda_body::BitplaneWeight& w,
                         const cuda_body::ConvShape& s, const float* scale, const float* bias, float* out,
                         void* stream);

/// Caps the blocks of every launch at `max_blocks` (0, or more than 2^31 − 1, restores the default
/// cap) and returns the
/// previous cap: tests use a small cap to run the grid-stride loops over more than one round.
unsigned set_cuda_grid_limit(unsigned max_blocks);

/// cudaGetErrorString of a code returned above.
const char* kernels_cuda_error_string(int code);

}  // namespace whittle::kernels::detail
