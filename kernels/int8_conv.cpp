// int8 convolution and addition (kernels/int8_conv.h): weight packing, padding, requantization
// constants, the variant choice and the portable variant.

#include "kernels/int8_conv.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/int8_gemm.h"
#include "kernels/isa.h"

namespace whittle::kernels {
namespace {

constexpr int64_t kBlock = 16;  // output channels a packed block holds
// Work below which a range of rows is not split across threads (multiply-adds; about 20 µs on one
// core of the portable variant, a few µs of the vector ones).
constexpr int64_t kMinMacsPerTask = int64_t{1} << 19;

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  // AVX512_VNNI: cpuid leaf 7.0 ECX bit 11 (Intel SDM vol. 2, CPUID); __builtin_cpu_supports checks
  // that the OS saves the AVX-512 registers.
  static const bool vnni = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    return ((ecx >> 11) & 1u) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return vnni;
#else
  return false;
#endif
}

detail::Int8ConvRowsFn conv_rows(Int8Variant v) {
  switch (v) {
#if defined(WHITTLE_KERNELS_X86)
    case Int8Variant::kAvx512Vnni: return detail::int8_conv_rows_avx512_vnni;
    case Int8Variant::kAvx2: return detail::int8_conv_rows_avx2;
#endif
    default: return detail::int8_conv_rows_scalar;
  }
}

detail::Int8AddFn add_fn(Int8Variant v) {
  switch (v) {
#if defined(WHITTLE_KERNELS_X86)
    case Int8Variant::kAvx512Vnni: return detail::int8_add_avx512_vnni;
    case Int8Variant::kAvx2: return detail::int8_add_avx2;
#endif
    default: return detail::int8_add_scalar;
  }
}

void check_grid(const char* what, float scale, int32_t zero_point) {
  if (!(scale > 0.0f) || !std::isfinite(scale))
    throw Error(std::string("int8 kernel: ") + what + " scale " + std::to_string(scale) + " is not a positive number");
  if (zero_point < 0 || zero_point > 255)
    throw Error(std::string("int8 kernel: ") + what + " zero point " + std::to_string(zero_point) +
                " is outside the uint8 codes [0, 255]");
}

void require_supported(Int8Variant v) {
  if (!int8_variant_supported(v))
    throw Error("int8 kernel: this CPU does not run the " + int8_variant_name(v) + " variant");
}

}  // namespace

std::string int8_variant_name(Int8Variant v) {
  switch (v) {
    case Int8Variant::kScalar: return "scalar";
    case Int8Variant::kAvx2: return "avx2";
    case Int8Variant::kAvx512Vnni: return "avx512_vnni";
  }
  return "?";
}

bool int8_variant_supported(Int8Variant v) {
  switch (v) {
    case Int8Variant::kScalar: return true;
#if defined(WHITTLE_KERNELS_X86)
    case Int8Variant::kAvx2: return __builtin_cpu_supports("avx2");
    case Int8Variant::kAvx512Vnni: return cpu_has_avx512_vnni();
#endif
    default: return false;
  }
}

Int8Variant int8_variant() {
  const Isa isa = active_isa();
  // Not limited below what the CPU runs (the popcount kernels' best may lack AVX512_VNNI's
  // neighbour VPOPCNTDQ, as on Cascade Lake): the best int8 variant here.
  if (isa != Isa::kScalar && isa == supported_isas().back()) {
    if (int8_variant_supported(Int8Variant::kAvx512Vnni)) return Int8Variant::kAvx512Vnni;
    if (int8_variant_supported(Int8Variant::kAvx2)) return Int8Variant::kAvx2;
  }
  switch (isa) {
    case Isa::kScalar: return Int8Variant::kScalar;
    case Isa::kAvx2: return Int8Variant::kAvx2;
    case Isa::kAvx512:
      return int8_variant_supported(Int8Variant::kAvx512Vnni) ? Int8Variant::kAvx512Vnni : Int8Variant::kAvx2;
  }
  return Int8Variant::kScalar;
}

int64_t Int8ConvShape::out_h(int64_t h) const {
  const int64_t span = h + 2 * pad_h - kernel_h;
  if (span < 0) throw Error("int8 conv2d: kernel height " + std::to_string(kernel_h) + " exceeds the padded input height " +
                            std::to_string(h + 2 * pad_h));
  return span / stride_h + 1;
}

int64_t Int8ConvShape::out_w(int64_t w) const {
  const int64_t span = w + 2 * pad_w - kernel_w;
  if (span < 0) throw Error("int8 conv2d: kernel width " + std::to_string(kernel_w) + " exceeds the padded input width " +
                            std::to_string(w + 2 * pad_w));
  return span / stride_w + 1;
}

Int8Conv2d::Int8Conv2d(const Int8ConvShape& shape, const int8_t* weight, const float* weight_scale, const float* bias,
                       Int8Variant variant)
    : shape_(shape), variant_(variant) {
  const Int8ConvShape& s = shape_;
  if (s.in_channels <= 0 || s.out_channels <= 0 || s.kernel_h <= 0 || s.kernel_w <= 0 || s.stride_h <= 0 ||
      s.stride_w <= 0 || s.pad_h < 0 || s.pad_w < 0)
    throw Error("int8 conv2d: channels, kernel and strides must be positive and padding non-negative");
  require_supported(variant);
  padded_channels_ = (s.in_channels + 3) / 4 * 4;
  const int64_t taps = s.kernel_h * s.kernel_w;
  // |Σ q_x·q_w| ≤ K·255·128 must stay below 2^31 (the padding channels' weights are zero).
  if (s.in_channels * taps >= 65536)
    throw Error("int8 conv2d: " + std::to_string(s.in_channels * taps) +
                " products a sum could overflow int32 (at most 65,535 per output)");
  const int64_t O = s.out_channels, C = s.in_channels, Cp = padded_channels_;
  const int64_t OB = (O + kBlock - 1) / kBlock;
  weight_scale_.assign(weight_scale, weight_scale + O);
  bias_.assign(O, 0.0f);
  if (bias) std::copy(bias, bias + O, bias_.begin());
  for (int64_t o = 0; o < O; ++o) {
    if (!(weight_scale_[o] > 0.0f) || !std::isfinite(weight_scale_[o]))
      throw Error("int8 conv2d: weight scale " + std::to_string(weight_scale_[o]) + " of output channel " +
                  std::to_string(o) + " is not a positive number");
    if (!std::isfinite(bias_[o]))
      throw Error("int8 conv2d: the bias of output channel " + std::to_string(o) + " is not finite");
  }
  weight_sum_.assign(O, 0);
  auto w_at = [&](int64_t o, int64_t c, int64_t t) -> int32_t {
    return (o < O && c < C) ? weight[(o * C + c) * taps + t] : 0;
  };
  for (int64_t o = 0; o < O; ++o)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < taps; ++t) weight_sum_[o] += w_at(o, c, t);
  if (variant == Int8Variant::kAvx2) {
    // int16 [OB][T][Cp/2][16][2]
    std::vector<int16_t> packed(OB * taps * Cp * kBlock, 0);
    for (int64_t ob = 0; ob < OB; ++ob)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t c = 0; c < Cp; ++c)
          for (int64_t j = 0; j < kBlock; ++j)
            packed[(((ob * taps + t) * (Cp / 2) + c / 2) * kBlock + j) * 2 + c % 2] =
                static_cast<int16_t>(w_at(ob * kBlock + j, c, t));
    weight_.resize(packed.size() * sizeof(int16_t));
    std::memcpy(weight_.data(), packed.data(), weight_.size());
  } else {
    // int8 [OB][T][Cp/4][16][4]
    weight_.assign(OB * taps * Cp * kBlock, 0);
    for (int64_t ob = 0; ob < OB; ++ob)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t c = 0; c < Cp; ++c)
          for (int64_t j = 0; j < kBlock; ++j)
            weight_[(((ob * taps + t) * (Cp / 4) + c / 4) * kBlock + j) * 4 + c % 4] =
                static_cast<int8_t>(w_at(ob * kBlock + j, c, t));
  }
}

Int8Conv2d::Requantization Int8Conv2d::requantization(float x_scale, int32_t x_zero_point, float y_scale,
                                                      int32_t y_zero_point, bool relu) const {
  check_grid("input", x_scale, x_zero_point);
  check_grid("output", y_scale, y_zero_point);
  const int64_t O = shape_.out_channels, padded = (O + kBlock - 1) / kBlock * kBlock;
  Requantization r;
  r.out_channels = O;
  r.x_scale = x_scale;
  r.x_zero_point = x_zero_point;
  r.zx_wsum.assign(padded, 0);
  r.m.assign(padded, 0.0f);
  r.c.assign(padded, 0.0f);
  for (int64_t o = 0; o < O; ++o) {
    r.zx_wsum[o] = x_zero_point * weight_sum_[o];
    r.m[o] = static_cast<float>(static_cast<double>(x_scale) * weight_scale_[o] / y_scale);
    r.c[o] = static_cast<float>(static_cast<double>(bias_[o]) / y_scale + y_zero_point);
  }
  r.lo = relu ? y_zero_point : 0;
  return r;
}

Int8Conv2d::Requantization Int8Conv2d::dequantization(float x_scale, int32_t x_zero_point) const {
  Requantization r = requantization(x_scale, x_zero_point, 1.0f, 0, false);
  for (int64_t o = 0; o < shape_.out_channels; ++o) {
    r.m[o] = static_cast<float>(static_cast<double>(x_scale) * weight_scale_[o]);
    r.c[o] = bias_[o];
  }
  r.to_float = true;
  return r;
}

void Int8Conv2d::run(const uint8_t* x, int64_t N, int64_t H, int64_t W, const Requantization& r, uint8_t* y) const {
  if (r.to_float) throw Error("int8 conv2d: a dequantization writes floats, not codes");
  run_into(x, N, H, W, r, y, nullptr);
}

void Int8Conv2d::run(const uint8_t* x, int64_t N, int64_t H, int64_t W, const Requantization& r, float* y) const {
  if (!r.to_float) throw Error("int8 conv2d: a requantization writes codes, not floats");
  run_into(x, N, H, W, r, nullptr, y);
}

void Int8Conv2d::run_into(const uint8_t* x, int64_t N, int64_t H, int64_t W, const Requantization& r, uint8_t* y,
                          float* y_float) const {
  if (N < 0 || H <= 0 || W <= 0) throw Error("int8 conv2d: the input has an empty or negative size");
  const Int8ConvShape& s = shape_;
  const int64_t OH = s.out_h(H), OW = s.out_w(W), C = s.in_channels, Cp = padded_channels_;
  const int64_t Hp = H + 2 * s.pad_h, Wp = W + 2 * s.pad_w;
  const int64_t OB = (s.out_channels + kBlock - 1) / kBlock;
  const auto padded = static_cast<size_t>(OB * kBlock);
  if (r.out_channels != s.out_channels || r.zx_wsum.size() != padded || r.m.size() != padded || r.c.size() != padded)
    throw Error("int8 conv2d: the requantization was made for a layer of " + std::to_string(r.out_channels) +
                " output channels, not this one's " + std::to_string(s.out_channels));
  if (N == 0) return;

  // The input with its padding (the zero point's code) and channels rounded up to 4 (zeros: their
  // weights are zero), as uint8 or, for AVX2, int16.
  const bool wide = variant_ == Int8Variant::kAvx2;
  thread_local std::vector<uint8_t> padded8;
  thread_local std::vector<int16_t> padded16;
  const int64_t padded_size = N * Hp * Wp * Cp;
  auto fill = [&](auto& buf) {
    using T = typename std::decay_t<decltype(buf)>::value_type;
    buf.resize(static_cast<size_t>(padded_size));
    T* base = buf.data();
    const T zero_point = static_cast<T>(r.x_zero_point);
    for (int64_t n = 0; n < N; ++n) {
      T* image = base + n * Hp * Wp * Cp;
      // The padding rows and columns read the zero point.
      std::fill(image, image + s.pad_h * Wp * Cp, zero_point);
      std::fill(image + (s.pad_h + H) * Wp * Cp, image + Hp * Wp * Cp, zero_point);
      for (int64_t h = 0; h < H; ++h) {
        const uint8_t* src = x + (n * H + h) * W * C;
        T* row = image + (h + s.pad_h) * Wp * Cp;
        std::fill(row, row + s.pad_w * Cp, zero_point);
        std::fill(row + (s.pad_w + W) * Cp, row + Wp * Cp, zero_point);
        T* dst = row + s.pad_w * Cp;
        if constexpr (sizeof(T) == 1) {
          if (C == Cp) {
            std::memcpy(dst, src, static_cast<size_t>(W * C));
            continue;
          }
          if (Cp == 4) {  // 1 to 3 channels (an image): one 4-byte word a pixel
            for (int64_t w = 0; w < W; ++w) {
              uint8_t word[4] = {src[w * C], 0, 0, 0};
              if (C > 1) word[1] = src[w * C + 1];
              if (C > 2) word[2] = src[w * C + 2];
              std::memcpy(dst + w * 4, word, 4);
            }
            continue;
          }
        }
        for (int64_t w = 0; w < W; ++w) {
          for (int64_t ch = 0; ch < C; ++ch) dst[w * Cp + ch] = static_cast<T>(src[w * C + ch]);
          for (int64_t ch = C; ch < Cp; ++ch) dst[w * Cp + ch] = 0;
        }
      }
    }
    return static_cast<const void*>(base);
  };
  // Without padding and with C a multiple of 4 the kernel reads the input where it is.
  const bool in_place = !wide && s.pad_h == 0 && s.pad_w == 0 && C == Cp;

  detail::Int8ConvArgs args;
  args.x = in_place ? static_cast<const void*>(x) : wide ? fill(padded16) : fill(padded8);
  args.Hp = Hp;
  args.Wp = Wp;
  args.Cp = Cp;
  args.KH = s.kernel_h;
  args.KW = s.kernel_w;
  args.SH = s.stride_h;
  args.SW = s.stride_w;
  args.OH = OH;
  args.OW = OW;
  args.O = s.out_channels;
  args.w = weight_.data();
  args.zx_wsum = r.zx_wsum.data();
  args.m = r.m.data();
  args.c = r.c.data();
  args.lo = r.lo;
  args.y = y;
  args.y_float = y_float;
  const detail::Int8ConvRowsFn rows = conv_rows(variant_);
  const int64_t row_macs = std::max<int64_t>(1, OW * s.out_channels * s.kernel_h * s.kernel_w * Cp);
  whittle::parallel_for(0, N * OH, std::max<int64_t>(1, kMinMacsPerTask / row_macs),
                        [&](int64_t begin, int64_t end) { rows(args, begin, end); });
}

void int8_add(const uint8_t* a, float a_scale, int32_t a_zero_point, const uint8_t* b, float b_scale,
              int32_t b_zero_point, uint8_t* y, float y_scale, int32_t y_zero_point, bool relu, int64_t n,
              Int8Variant variant) {
  check_grid("first input", a_scale, a_zero_point);
  check_grid("second input", b_scale, b_zero_point);
  check_grid("output", y_scale, y_zero_point);
  require_supported(variant);
  const float ma = static_cast<float>(static_cast<double>(a_scale) / y_scale);
  const float mb = static_cast<float>(static_cast<double>(b_scale) / y_scale);
  const float c = static_cast<float>(y_zero_point - a_zero_point * static_cast<double>(ma) -
                                     b_zero_point * static_cast<double>(mb));
  const detail::Int8AddFn fn = add_fn(variant);
  const int32_t lo = relu ? y_zero_point : 0;
  // Chunks of 16 Ki values a task (a few µs each).
  whittle::parallel_for(0, (n + 16383) / 16384, 1, [&](int64_t b0, int64_t b1) {
    const int64_t i0 = b0 * 16384, i1 = std::min(n, b1 * 16384);
    fn(a + i0, b + i0, y + i0, i1 - i0, ma, mb, c, lo);
  });
}

void int8_quantize_channels_last(const float* x, int64_t N, int64_t C, int64_t HW, float scale, int32_t zero_point,
                                 bool relu, uint8_t* y) {
  check_grid("quantizer", scale, zero_point);
  const int32_t lo = relu ? zero_point : 0;
  whittle::parallel_for(0, N, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C * HW)), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t c = 0; c < C; ++c) {
        const float* src = x + (n * C + c) * HW;
        uint8_t* dst = y + n * HW * C + c;
        for (int64_t i = 0; i < HW; ++i) {
          float u = src[i] / scale;
          u = u > -512.0f ? (u < 512.0f ? u : 512.0f) : -512.0f;  // NaN → −512
          const int32_t q = static_cast<int32_t>(__builtin_nearbyintf(u)) + zero_point;
          dst[i * C] = static_cast<uint8_t>(q < lo ? lo : (q > 255 ? 255 : q));
        }
      }
  });
}

namespace detail {

void int8_conv_rows_scalar(const Int8ConvArgs& g, int64_t row_begin, int64_t row_end) {
  const auto* x = static_cast<const uint8_t*>(g.x);
  const auto* w = static_cast<const int8_t*>(g.w);
  const int64_t taps = g.KH * g.KW, Cq = g.Cp / 4;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t n = r / g.OH, oh = r % g.OH;
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      const int64_t at = (r * g.OW + ow) * g.O;
      for (int64_t o = 0; o < g.O; ++o) {
        const int64_t ob = o / kBlock, j = o % kBlock;
        int32_t acc = 0;
        for (int64_t kh = 0; kh < g.KH; ++kh)
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            const uint8_t* xp = x + ((n * g.Hp + oh * g.SH + kh) * g.Wp + ow * g.SW + kw) * g.Cp;
            const int8_t* wp = w + (ob * taps + kh * g.KW + kw) * Cq * kBlock * 4 + j * 4;
            for (int64_t q = 0; q < Cq; ++q)
              for (int64_t i = 0; i < 4; ++i) acc += int32_t{xp[q * 4 + i]} * int32_t{wp[q * kBlock * 4 + i]};
          }
        if (g.y_float)
          g.y_float[at + o] = dequantize_sum(acc, g.zx_wsum[o], g.m[o], g.c[o]);
        else
          g.y[at + o] = requantize(acc, g.zx_wsum[o], g.m[o], g.c[o], g.lo);
      }
    }
  }
}

void int8_add_scalar(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, float ma, float mb, float c,
                     int32_t lo) {
  for (int64_t i = 0; i < n; ++i) {
    const float pa = static_cast<float>(a[i]) * ma;
    const float pb = static_cast<float>(b[i]) * mb;
    const float s = pa + pb;
    y[i] = round_to_code(s + c, lo);
  }
}

}  // namespace detail
}  // namespace whittle::kernels
