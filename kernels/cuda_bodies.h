#pragma once
// The per-thread work of the CUDA bitpacked kernels (kernels/kernels_cuda.cu): what one GPU thread
// computes, written once as __host__ __device__ functions of plain pointers and indices, so that
// the kernels are thin index maps over them and the same code runs on the host in tests
// (tests/kernels_cuda_test.cpp runs every body over every index and compares with the CPU kernels, on
// any machine). No LibTorch, no CUDA runtime: nvcc compiles it for the device, any C++ compiler
// for the host.
//
// Layouts are the CPU kernels' (bitpack.h, binary_conv.h, bitplane.h): packed maps are NHWC words
// [N, H, W, Cw] with channel c at bit c mod 64 of word c / 64 (bit 1: negative, or plane bit set);
// packed weights are K-major words [KH·KW·Cw, O]. Words are uint64.

#include <cstdint>

#include "core/cuda_grid.h"  // WHITTLE_HD, the launch geometry

namespace whittle::kernels::cuda_body {

/// Bits set in v (__popcll on the device).
WHITTLE_HD int popcount64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __popcll(v);
#else
  return __builtin_popcountll(v);
#endif
}

/// Geometry of a packed convolution (a linear layer: H = W = Ho = Wo = 1, kernel 1×1, no padding).
struct ConvShape {
  int64_t N = 1, H = 1, W = 1;
  int64_t C = 1, Cw = 1;  ///< input channels and their words per position
  int64_t O = 1;          ///< output channels
  int64_t KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t Ho = 1, Wo = 1;
};

/// Output word i of pack_signs (words [N, HW, Cw], k fastest) as (n, p, k): the index map of the
/// packing kernels (signs and bit-planes).
struct PackIndex {
  int64_t n, p, k;
};
WHITTLE_HD PackIndex pack_index(int64_t C, int64_t HW, int64_t i) {
  const int64_t Cw = (C + 63) / 64;
  return {i / (Cw * HW), (i / Cw) % HW, i % Cw};
}

/// Word k of the packed signs of position p (of HW) of image n, from a contiguous float map x
/// [N, C, HW] (HW = 1 for a matrix [N, C]): bit b is 1 where x[n, 64k + b, p] is negative or NaN
/// (not ≥ 0); bits past C are 0.
WHITTLE_HD uint64_t pack_sign_word(const float* x, int64_t C, int64_t HW, int64_t n, int64_t p, int64_t k) {
  uint64_t bits = 0;
  const int64_t c0 = k * 64, count = C - c0 < 64 ? C - c0 : 64;
  for (int64_t b = 0; b < count; ++b) bits |= static_cast<uint64_t>(!(x[(n * C + c0 + b) * HW + p] >= 0.0f)) << b;
  return bits;
}

/// Word k of each of the `bits` bit-planes of the integer codes at position p of image n, from a
/// contiguous float map x [N, C, HW]: out[j] gets bit j of every code. Returns false when a code is
/// not an integer in [0, 2^bits) (NaN included); such a code packs as 0.
WHITTLE_HD bool pack_bitplane_words(const float* x, int64_t C, int64_t HW, int64_t n, int64_t p, int64_t k, int bits,
                                    uint64_t* out) {
  for (int j = 0; j < bits; ++j) out[j] = 0;
  bool ok = true;
  const float top = static_cast<float>(1 << bits);
  const int64_t c0 = k * 64, count = C - c0 < 64 ? C - c0 : 64;
  for (int64_t b = 0; b < count; ++b) {
    const float f = x[(n * C + c0 + b) * HW + p];
    const bool in_range = f >= 0.0f && f < top;  // false for NaN
    const int code = in_range ? static_cast<int>(f) : 0;
    ok = ok && in_range && f == static_cast<float>(code);
    for (int j = 0; j < bits; ++j) out[j] |= static_cast<uint64_t>((code >> j) & 1) << b;
  }
  return ok;
}

/// Window of a max pooling over packed signs.
struct PoolShape {
  int64_t N = 1, H = 1, W = 1, Cw = 1, Ho = 1, Wo = 1;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
};

/// The PoolShape of max_pool2d_signs from packed signs of sizes [N, H, W, Cw] to [N, Ho, Wo, Cw],
/// with the window of `o` (kernels::SignPool2dOptions, or anything with its six fields). Host code.
template <class Options>
PoolShape pool_shape(const int64_t* sizes, int64_t Ho, int64_t Wo, const Options& o) {
  PoolShape s;
  s.N = sizes[0];
  s.H = sizes[1];
  s.W = sizes[2];
  s.Cw = sizes[3];
  s.Ho = Ho;
  s.Wo = Wo;
  s.kernel_h = o.kernel_h;
  s.kernel_w = o.kernel_w;
  s.stride_h = o.stride_h;
  s.stride_w = o.stride_w;
  s.pad_h = o.pad_h;
  s.pad_w = o.pad_w;
  return s;
}

/// Output word i of max_pool2d_signs ([N, Ho, Wo, Cw] order) as (n, ho, wo, k); also the index map
/// of the packed threshold output of a binary layer ([N, Ho, Wo, ⌈O/64⌉]: pass ⌈O/64⌉ as Cw).
struct WordIndex {
  int64_t n, h, w, k;
};
WHITTLE_HD WordIndex word_index(int64_t Ho, int64_t Wo, int64_t Cw, int64_t i) {
  return {i / (Cw * Wo * Ho), (i / (Cw * Wo)) % Ho, (i / Cw) % Wo, i % Cw};
}

/// Word k of output position (n, ho, wo) of max_pool2d_signs: the AND of the window's words
/// inside the input (padding left out) of src [N, H, W, Cw].
WHITTLE_HD uint64_t pool_sign_word(const uint64_t* src, const PoolShape& s, int64_t n, int64_t ho, int64_t wo,
                                   int64_t k) {
  const int64_t hs = ho * s.stride_h - s.pad_h, ws = wo * s.stride_w - s.pad_w;
  const int64_t h0 = hs < 0 ? 0 : hs, h1 = hs + s.kernel_h < s.H ? hs + s.kernel_h : s.H;
  const int64_t w0 = ws < 0 ? 0 : ws, w1 = ws + s.kernel_w < s.W ? ws + s.kernel_w : s.W;
  uint64_t y = ~uint64_t{0};
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t w = w0; w < w1; ++w) y &= src[((n * s.H + h) * s.W + w) * s.Cw + k];
  return y;
}

/// Output i of a convolution ([N, O, Ho, Wo] order) as (n, o, oh, ow): the index map of the binary
/// and bit-plane kernels with int32 or float outputs.
struct ConvIndex {
  int64_t n, o, oh, ow;
};
WHITTLE_HD ConvIndex conv_index(const ConvShape& s, int64_t i) {
  return {i / (s.Wo * s.Ho * s.O), (i / (s.Wo * s.Ho)) % s.O, (i / s.Wo) % s.Ho, i % s.Wo};
}

/// The exact integer dot of output (n, o, oh, ow) of a binary convolution: Σ over the taps inside
/// the input of C − 2·popcount(x ⊕ w) (padded taps contribute 0). x: packed map [N, H, W, Cw];
/// w: packed weight [KH·KW·Cw, O].
WHITTLE_HD int32_t binary_dot(const uint64_t* x, const uint64_t* w, const ConvShape& s, int64_t n, int64_t o,
                              int64_t oh, int64_t ow) {
  int32_t dot = 0;
  const int64_t ih0 = oh * s.stride_h - s.pad_h, iw0 = ow * s.stride_w - s.pad_w;
  for (int64_t i = 0; i < s.KH; ++i) {
    const int64_t ih = ih0 + i;
    if (ih < 0 || ih >= s.H) continue;
    for (int64_t j = 0; j < s.KW; ++j) {
      const int64_t iw = iw0 + j;
      if (iw < 0 || iw >= s.W) continue;
      const uint64_t* a = x + ((n * s.H + ih) * s.W + iw) * s.Cw;
      const uint64_t* b = w + (i * s.KW + j) * s.Cw * s.O + o;
      int32_t mismatches = 0;
      for (int64_t k = 0; k < s.Cw; ++k) mismatches += popcount64(a[k] ^ b[k * s.O]);
      dot += static_cast<int32_t>(s.C) - 2 * mismatches;
    }
  }
  return dot;
}

/// The float epilogue of a binary layer: y = d·scale[o] + bias[o], each operation rounded on its
/// own (the device code is compiled with -fmad=false), as the CPU kernels compute it.
WHITTLE_HD float binary_value(int32_t dot, const float* scale, const float* bias, int64_t o) {
  return static_cast<float>(dot) * scale[o] + bias[o];
}

/// The threshold epilogue's bit for output channel o: 1 (a −1 sign) unless
/// (y − threshold[o])·direction[o] ≥ 0 (a NaN y gives 1).
WHITTLE_HD uint64_t threshold_bit(float y, const float* threshold, const float* direction, int64_t o) {
  return (y - threshold[o]) * direction[o] >= 0.0f ? 0u : 1u;
}

/// Word k of the packed threshold signs of output position (n, oh, ow): channels 64k … 64k + 63
/// (below O), each from binary_dot, binary_value and threshold_bit.
WHITTLE_HD uint64_t binary_threshold_word(const uint64_t* x, const uint64_t* w, const ConvShape& s, const float* scale,
                                          const float* bias, const float* threshold, const float* direction, int64_t n,
                                          int64_t oh, int64_t ow, int64_t k) {
  uint64_t bits = 0;
  const int64_t o0 = k * 64, count = s.O - o0 < 64 ? s.O - o0 : 64;
  for (int64_t b = 0; b < count; ++b) {
    const int64_t o = o0 + b;
    const float y = binary_value(binary_dot(x, w, s, n, o, oh, ow), scale, bias, o);
    bits |= threshold_bit(y, threshold, direction, o) << b;
  }
  return bits;
}

/// Most weight planes a bit-plane layer has (DoReFa 8-bit weights).
constexpr int kMaxPlanes = 8;

/// A bit-plane weight as the kernels read it: value = Σ_i coefficients[i]·plane_i + offset.
struct BitplaneWeight {
  const uint64_t* planes[kMaxPlanes] = {};  ///< each [KH·KW·Cw, O] words (pack_binary_weight's layout)
  double coefficients[kMaxPlanes] = {};
  double offset = 0.0;
  int count = 0;  ///< planes in use, 1 … kMaxPlanes
};

/// Output (n, o, oh, ow) of a bit-plane convolution from activation planes x [P, N, H, W, Cw]:
/// with acc_i = Σ_j 2^j·popcount(a_j ∧ w_i) and ones = Σ_j 2^j·popcount(a_j) over the taps inside
/// the input (int32, exact), v = offset·ones + Σ_i coefficients[i]·acc_i in double, in that order,
/// and y = float(v)·scale[o] + bias[o]: the CPU kernel's operations in its order.
WHITTLE_HD float bitplane_value(const uint64_t* x, int64_t P, const BitplaneWeight& w, const ConvShape& s,
                                const float* scale, const float* bias, int64_t n, int64_t o, int64_t oh, int64_t ow) {
  int32_t acc[kMaxPlanes] = {};
  int64_t ones = 0;
  const int64_t plane_words = s.N * s.H * s.W * s.Cw;
  const int64_t ih0 = oh * s.stride_h - s.pad_h, iw0 = ow * s.stride_w - s.pad_w;
  for (int64_t j = 0; j < P; ++j) {
    int64_t ones_j = 0;
    int32_t acc_j[kMaxPlanes] = {};
    for (int64_t i = 0; i < s.KH; ++i) {
      const int64_t ih = ih0 + i;
      if (ih < 0 || ih >= s.H) continue;
      for (int64_t t = 0; t < s.KW; ++t) {
        const int64_t iw = iw0 + t;
        if (iw < 0 || iw >= s.W) continue;
        const uint64_t* a = x + j * plane_words + ((n * s.H + ih) * s.W + iw) * s.Cw;
        const int64_t row = (i * s.KW + t) * s.Cw;
        for (int64_t k = 0; k < s.Cw; ++k) {
          const uint64_t word = a[k];
          ones_j += popcount64(word);
          for (int p = 0; p < w.count; ++p) acc_j[p] += popcount64(word & w.planes[p][(row + k) * s.O + o]);
        }
      }
    }
    ones += ones_j << j;
    for (int p = 0; p < w.count; ++p) acc[p] += acc_j[p] << j;
  }
  double v = w.offset * static_cast<double>(ones);
  for (int p = 0; p < w.count; ++p) v += w.coefficients[p] * acc[p];
  return static_cast<float>(v) * scale[o] + bias[o];
}

}  // namespace whittle::kernels::cuda_body
