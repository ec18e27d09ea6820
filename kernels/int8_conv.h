#pragma once
// int8 convolution and addition on uint8 activation codes and int8 weight codes, channels-last, with
// the requantization to the next quantizer's grid fused (Jacob et al. 2018, "Quantization and
// Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference", section 2.3).
//
// Math. An input value is x = s_x·(q_x − z_x) (uint8 codes q_x, zero point z_x), a weight
// w = s_w[o]·q_w (int8 codes, symmetric, one scale per output channel o). A convolution sums in
// int32 exactly:
//   a[o] = Σ q_x·q_w − z_x·Σ q_w,
// where a padded tap reads z_x (the code of 0, so it adds nothing). Each output code is then
//   q_y = clamp(round_half_even(float(a)·m[o] + c[o]), lo, 255),  m[o] = s_x·s_w[o]/s_y,
//   c[o] = bias[o]/s_y + z_y,  lo = z_y with a fused ReLU, else 0,
// in float32, one multiply and one add, rounded separately (no FMA), so every instruction-set
// variant gives the same codes bit for bit. The fake-quantized graph rounds s_x·s_w·a + bias
// divided by s_y: a code next to a rounding boundary may land one level apart from it.
//
// Variants (chosen at run time from kernels/isa.h): a portable one, AVX2 (vpmaddwd on int16
// pairs, exact: a pair of products is at most 2·255·128) and AVX-512 VNNI (vpdpbusd, four uint8 ×
// int8 products into int32, no saturation). fbgemm's AVX2 path adds pairs in 16 bits with
// saturation (vpmaddubsw); these kernels do not. Plain C++ with intrinsics, no LibTorch.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace whittle::kernels {

/// An instruction-set variant of the int8 kernels.
enum class Int8Variant {
  kScalar,      ///< portable C++
  kAvx2,        ///< AVX2: uint8 and int8 codes widened to int16, vpmaddwd
  kAvx512Vnni,  ///< AVX-512 (F, BW, VL) with AVX512_VNNI: vpdpbusd
};

/// "scalar", "avx2" or "avx512_vnni".
std::string int8_variant_name(Int8Variant v);
/// Whether this CPU runs `v` (cpuid).
bool int8_variant_supported(Int8Variant v);
/// The variant for kernels/isa.h's active_isa(): where that is the best this CPU runs (nothing
/// limited it), the best int8 variant (avx512_vnni where the CPU has AVX512_VNNI, even without the
/// popcount kernels' VPOPCNTDQ); else scalar for kScalar, avx2 for kAvx2, and for kAvx512
/// avx512_vnni where the CPU has VNNI, else avx2.
Int8Variant int8_variant();

/// Geometry of a convolution the int8 kernels run: groups 1, dilation 1, zero padding.
struct Int8ConvShape {
  int64_t in_channels = 0, out_channels = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  /// Output height and width for an input of h × w (floor division, as ATen). Throws
  /// whittle::Error when the kernel does not fit the padded input.
  int64_t out_h(int64_t h) const;
  int64_t out_w(int64_t w) const;
};

/// A convolution with its int8 weight packed once for one variant, run on uint8 codes
/// (see the top of this file for the math).
class Int8Conv2d {
 public:
  /// `weight`: int8 codes [O][C][kernel_h][kernel_w] (row-major, PyTorch's layout);
  /// `weight_scale`: O scales (s_w, one per output channel; repeat a per-tensor scale);
  /// `bias`: O floats or nullptr. Throws whittle::Error for a non-positive size, a scale that is not
  /// a positive number, a bias that is not finite, a variant this CPU does not run, or sums that
  /// could overflow int32 (C·kernel_h·kernel_w ≥ 65,536).
  Int8Conv2d(const Int8ConvShape& shape, const int8_t* weight, const float* weight_scale, const float* bias,
             Int8Variant variant = int8_variant());

  /// The per-channel constants of the requantization from the input grid (x_scale,
  /// x_zero_point) to the output grid (y_scale, y_zero_point), clamped below at y_zero_point when
  /// `relu` (see the top of this file), for run(): compute them once where the grids are fixed.
  /// Throws whittle::Error for a non-positive scale or a zero point outside [0, 255].
  struct Requantization {
    int64_t out_channels = 0;  // O of the layer it was made for
    float x_scale = 0.0f;
    int32_t x_zero_point = 0;
    std::vector<int32_t> zx_wsum;  // z_x·Σ q_w, ⌈O/16⌉·16 entries (zero beyond O)
    std::vector<float> m, c;       // s_x·s_w/s_y and bias/s_y + z_y, as zx_wsum (to_float: s_x·s_w, bias)
    int32_t lo = 0;
    bool to_float = false;  // made by dequantization(): float output
  };
  Requantization requantization(float x_scale, int32_t x_zero_point, float y_scale, int32_t y_zero_point,
                                bool relu) const;
  /// The constants of a float output from the input grid (x_scale, x_zero_point):
  /// y = float(a)·(s_x·s_w[o]) + bias[o], one multiply and one add in float32, not rounded to any
  /// grid (a layer whose output no quantizer reads, as a classifier's logits). Throws as
  /// requantization() does.
  Requantization dequantization(float x_scale, int32_t x_zero_point) const;

  /// Runs the convolution. `x`: uint8 codes [N][H][W][C] (channels-last, dense) on the input grid
  /// of `r`; `y`: [N][out_h(H)][out_w(W)][O], written on its output grid. Spreads rows over ATen's
  /// intra-op threads (core/parallel.h); N = 0 writes nothing. Throws whittle::Error for an empty
  /// map, one smaller than the kernel, or a requantization made for another layer. The caller
  /// guarantees that x holds N·H·W·C codes (C the layer's input channels).
  void run(const uint8_t* x, int64_t N, int64_t H, int64_t W, const Requantization& r, uint8_t* y) const;
  /// The same with float output y [N][out_h(H)][out_w(W)][O], for a `r` from dequantization().
  void run(const uint8_t* x, int64_t N, int64_t H, int64_t W, const Requantization& r, float* y) const;
  /// The same with the requantization computed for this call.
  void run(const uint8_t* x, int64_t N, int64_t H, int64_t W, float x_scale, int32_t x_zero_point, uint8_t* y,
           float y_scale, int32_t y_zero_point, bool relu) const {
    run(x, N, H, W, requantization(x_scale, x_zero_point, y_scale, y_zero_point, relu), y);
  }

  const Int8ConvShape& shape() const { return shape_; }
  Int8Variant variant() const { return variant_; }

 private:
  Int8ConvShape shape_;
  Int8Variant variant_;
  int64_t padded_channels_ = 0;     // C rounded up to 4
  std::vector<int8_t> weight_;      // packed for variant_ (kernels/int8_gemm.h)
  std::vector<int32_t> weight_sum_; // Σ q_w per output channel
  std::vector<float> weight_scale_, bias_;

  void run_into(const uint8_t* x, int64_t N, int64_t H, int64_t W, const Requantization& r, uint8_t* y,
                float* y_float) const;
};

/// Elementwise sum of two uint8-coded tensors of n values each, requantized:
///   q_y = clamp(round_half_even(q_a·m_a + q_b·m_b + c), lo, 255),  m_a = s_a/s_y, m_b = s_b/s_y,
///   c = z_y − z_a·m_a − z_b·m_b,  lo = z_y with `relu`, else 0,
/// each operation rounded to float32 in that order (the same codes in every variant).
/// Spreads over ATen's intra-op threads. Throws whittle::Error for a non-positive scale or a zero
/// point outside [0, 255].
void int8_add(const uint8_t* a, float a_scale, int32_t a_zero_point, const uint8_t* b, float b_scale,
              int32_t b_zero_point, uint8_t* y, float y_scale, int32_t y_zero_point, bool relu, int64_t n,
              Int8Variant variant = int8_variant());

/// Quantizes float values x [N][C][H·W] (NCHW, dense) to uint8 codes y [N][H·W][C]
/// (channels-last): q = clamp(round_half_even(x/s) + z, lo, 255), the division in float32 as the
/// graph's int8 quantizer computes it (quantize/int8.cpp), lo = z with `relu`, else 0; NaN gives
/// lo. Spreads images over ATen's intra-op threads. Throws whittle::Error for a non-positive scale
/// or a zero point outside [0, 255].
void int8_quantize_channels_last(const float* x, int64_t N, int64_t C, int64_t HW, float scale, int32_t zero_point,
                                 bool relu, uint8_t* y);

}  // namespace whittle::kernels
