#pragma once
// The int8 convolution microkernels of kernels/int8_conv.h, one per instruction-set variant, each
// compiled in its own unit with its own target flags (kernels/CMakeLists.txt). No LibTorch.
//
// Layouts (O output channels in blocks of 16, OB = ⌈O/16⌉; T = kernel_h·kernel_w taps; Cp the input
// channels rounded up to 4; padding channels and output channels hold zero weights):
// - scalar and AVX-512 VNNI: weight int8 [OB][T][Cp/4][16][4] (a 64-byte row holds 4 consecutive
//   input channels of 16 output channels, vpdpbusd's operand); input uint8 [N][Hp][Wp][Cp];
// - AVX2: weight int16 [OB][T][Cp/2][16][2] (two 32-byte rows of 8 output channels × 2 input
//   channels, vpmaddwd's operand); input int16 [N][Hp][Wp][Cp].
// Hp, Wp: the input height and width with the zero padding added, filled with the input's zero
// point (the code of 0).

#include <cstdint>

namespace whittle::kernels::detail {

/// One int8 convolution as a variant reads it.
struct Int8ConvArgs {
  const void* x = nullptr;  ///< padded input (uint8 or int16, see above)
  int64_t Hp = 0, Wp = 0, Cp = 0;
  int64_t KH = 1, KW = 1, SH = 1, SW = 1;
  int64_t OH = 0, OW = 0, O = 0;
  const void* w = nullptr;           ///< packed weight (int8 or int16, see above)
  const int32_t* zx_wsum = nullptr;  ///< z_x·Σ q_w per output channel, OB·16 entries
  const float* m = nullptr;          ///< s_x·s_w/s_y per output channel, OB·16 entries
  const float* c = nullptr;          ///< bias/s_y + z_y per output channel, OB·16 entries
  int32_t lo = 0;                    ///< the lowest output code (z_y with a fused ReLU)
  uint8_t* y = nullptr;              ///< output uint8 [N][OH][OW][O] (when y_float is not set)
  /// When set, the output is float [N][OH][OW][O]: float(acc − zx_wsum)·m + c, not rounded (m is
  /// then s_x·s_w and c the bias).
  float* y_float = nullptr;
};

/// Computes the output rows [row_begin, row_end) of the N·OH rows (row r: image r / OH, output row
/// r mod OH).
using Int8ConvRowsFn = void (*)(const Int8ConvArgs& args, int64_t row_begin, int64_t row_end);
void int8_conv_rows_scalar(const Int8ConvArgs& args, int64_t row_begin, int64_t row_end);
void int8_conv_rows_avx2(const Int8ConvArgs& args, int64_t row_begin, int64_t row_end);
void int8_conv_rows_avx512_vnni(const Int8ConvArgs& args, int64_t row_begin, int64_t row_end);

/// y[i] = clamp(round_half_even(a[i]·ma + b[i]·mb + c), lo, 255) for i < n (kernels/int8_conv.h).
using Int8AddFn = void (*)(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, float ma, float mb, float c,
                           int32_t lo);
void int8_add_scalar(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, float ma, float mb, float c, int32_t lo);
void int8_add_avx2(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, float ma, float mb, float c, int32_t lo);
void int8_add_avx512_vnni(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, float ma, float mb, float c,
                          int32_t lo);

// (static: each unit compiles its own copy with its own target flags, so that the portable variant
// never links a copy built for AVX2.)

/// round_half_even(u) clamped to [lo, 255]: the last operation of every requantization. The value
/// is clamped in float first, NaN to −1 (to [−1, 256], which does not change the result), so that
/// the integer conversion is defined; the vector variants do the same (their max/min return the
/// bound for NaN).
static inline uint8_t round_to_code(float u, int32_t lo) {
  const float clamped = u > -1.0f ? (u < 256.0f ? u : 256.0f) : -1.0f;
  const int32_t q = static_cast<int32_t>(__builtin_nearbyintf(clamped));
  return static_cast<uint8_t>(q < lo ? lo : (q > 255 ? 255 : q));
}

/// The requantization of one convolution sum (the scalar form every variant matches).
static inline uint8_t requantize(int32_t acc, int32_t zx_wsum, float m, float c, int32_t lo) {
  const float v = static_cast<float>(acc - zx_wsum) * m;
  return round_to_code(v + c, lo);
}

/// The float output of one convolution sum (Int8ConvArgs::y_float).
static inline float dequantize_sum(int32_t acc, int32_t zx_wsum, float m, float c) {
  const float v = static_cast<float>(acc - zx_wsum) * m;
  return v + c;
}

}  // namespace whittle::kernels::detail
