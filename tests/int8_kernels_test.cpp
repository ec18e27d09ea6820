// int8 kernels (kernels/int8_conv.h): hand-worked codes, and every variant against an integer
// reference built on ATen's double convolution, exactly.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/int8_conv.h"
#include "support.h"

namespace whittle {
namespace {

using kernels::Int8Conv2d;
using kernels::Int8ConvShape;
using kernels::Int8Variant;

// Expects `f` to throw a whittle::Error whose message contains `what`.
template <class F>
void expect_error_contains(F&& f, const std::string& what) {
  try {
    std::forward<F>(f)();
    ADD_FAILURE() << "no error was thrown; expected one naming \"" << what << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

std::vector<Int8Variant> supported_variants() {
  std::vector<Int8Variant> out;
  for (Int8Variant v : {Int8Variant::kScalar, Int8Variant::kAvx2, Int8Variant::kAvx512Vnni})
    if (kernels::int8_variant_supported(v)) out.push_back(v);
  return out;
}

// The header's requantization of an exact sum a, in double only where the header computes m and c.
uint8_t requantize_by_the_formula(int64_t a, double x_scale, double w_scale, double bias, double y_scale,
                                  int64_t y_zero_point, bool relu) {
  const float m = static_cast<float>(static_cast<double>(static_cast<float>(x_scale)) * static_cast<float>(w_scale) /
                                     static_cast<float>(y_scale));
  const float c = static_cast<float>(static_cast<double>(static_cast<float>(bias)) / static_cast<float>(y_scale) +
                                     static_cast<double>(y_zero_point));
  const float v = static_cast<float>(a) * m;
  const float u = v + c;
  const double q = std::nearbyint(std::min(256.0f, std::max(-1.0f, u)));
  const double lo = relu ? static_cast<double>(y_zero_point) : 0.0;
  return static_cast<uint8_t>(std::min(255.0, std::max(lo, q)));
}

struct ConvCase {
  int64_t N, C, H, W, O;
  int64_t kh, kw, sh, sw, ph, pw;
  bool relu;
};

// Random codes for `c`, the kernel's output for every supported variant and thread count, and
// the reference: exact sums Σ (q_x − z_x)·q_w from ATen's double convolution, requantized by the
// header's formula. Also checks that the formula lands within one code of the real-valued result.
void check_conv_case(const ConvCase& c) {
  SCOPED_TRACE("N" + std::to_string(c.N) + " C" + std::to_string(c.C) + " " + std::to_string(c.H) + "x" +
               std::to_string(c.W) + " O" + std::to_string(c.O) + " k" + std::to_string(c.kh) + "x" +
               std::to_string(c.kw) + " s" + std::to_string(c.sh) + "," + std::to_string(c.sw) + " p" +
               std::to_string(c.ph) + "," + std::to_string(c.pw));
  const at::Tensor x = at::randint(0, 256, {c.N, c.H, c.W, c.C}, at::kByte);
  at::Tensor w = at::randint(-127, 128, {c.O, c.C, c.kh, c.kw}, at::kChar);
  w.view(-1)[0] = -128;  // the whole int8 range
  const at::Tensor w_scale = (at::rand({c.O}) * 0.02 + 0.001).to(at::kFloat).contiguous();
  const at::Tensor bias = (at::randn({c.O}) * 0.5).to(at::kFloat).contiguous();
  const float x_scale = 0.037f, y_scale = 0.21f;
  const int32_t x_zero_point = 117, y_zero_point = 61;

  Int8ConvShape s;
  s.in_channels = c.C;
  s.out_channels = c.O;
  s.kernel_h = c.kh;
  s.kernel_w = c.kw;
  s.stride_h = c.sh;
  s.stride_w = c.sw;
  s.pad_h = c.ph;
  s.pad_w = c.pw;
  const int64_t OH = s.out_h(c.H), OW = s.out_w(c.W);

  const at::Tensor xd = x.permute({0, 3, 1, 2}).to(at::kDouble) - x_zero_point;
  const at::Tensor acc =
      at::conv2d(xd, w.to(at::kDouble), {}, {c.sh, c.sw}, {c.ph, c.pw}).permute({0, 2, 3, 1}).contiguous();
  ASSERT_EQ(acc.sizes(), (at::IntArrayRef{c.N, OH, OW, c.O}));
  std::vector<uint8_t> expected(static_cast<size_t>(acc.numel()));
  const double* a = acc.data_ptr<double>();
  int64_t off_by_one = 0;
  for (int64_t i = 0; i < acc.numel(); ++i) {
    const int64_t o = i % c.O;
    expected[i] = requantize_by_the_formula(static_cast<int64_t>(a[i]), x_scale, w_scale[o].item<float>(),
                                            bias[o].item<float>(), y_scale, y_zero_point, c.relu);
    const double real = (x_scale * static_cast<double>(w_scale[o].item<float>()) * a[i] + bias[o].item<float>()) / y_scale;
    const double exact = std::min(255.0, std::max(c.relu ? double(y_zero_point) : 0.0, std::nearbyint(real) + y_zero_point));
    ASSERT_LE(std::abs(exact - expected[i]), 1.0) << "at " << i;
    off_by_one += exact != expected[i];
  }
  EXPECT_LE(off_by_one, acc.numel() / 100 + 1);  // a tie broken by float rounding is rare

  for (Int8Variant v : supported_variants()) {
    SCOPED_TRACE(kernels::int8_variant_name(v));
    const Int8Conv2d conv(s, w.contiguous().data_ptr<int8_t>(), w_scale.data_ptr<float>(), bias.data_ptr<float>(), v);
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      std::vector<uint8_t> got(expected.size(), 0xAB);
      conv.run(x.data_ptr<uint8_t>(), c.N, c.H, c.W, x_scale, x_zero_point, got.data(), y_scale, y_zero_point, c.relu);
      int64_t mismatches = 0;
      for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != expected[i];
      EXPECT_EQ(mismatches, 0) << "threads " << threads;
      // Float output (a layer no quantizer reads): float(a)·(s_x·s_w) + b, exactly.
      std::vector<float> got_float(expected.size(), -1.0f);
      conv.run(x.data_ptr<uint8_t>(), c.N, c.H, c.W, conv.dequantization(x_scale, x_zero_point), got_float.data());
      int64_t float_mismatches = 0;
      for (int64_t i = 0; i < acc.numel(); ++i) {
        const int64_t o = i % c.O;
        const float m = static_cast<float>(static_cast<double>(x_scale) * w_scale[o].item<float>());
        const float v = static_cast<float>(static_cast<int64_t>(a[i])) * m;
        float_mismatches += got_float[i] != v + bias[o].item<float>();
      }
      EXPECT_EQ(float_mismatches, 0) << "threads " << threads;
    }
  }
}

TEST(Int8Conv, EveryVariantEqualsTheIntegerReference) {
  at::manual_seed(3);
  const int threads = at::get_num_threads();
  for (const ConvCase& c : {
           ConvCase{2, 3, 9, 7, 16, 3, 3, 1, 1, 1, 1, false},    // a stem: 3 channels padded to 4
           ConvCase{1, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, true},  // ResNet-20's first stage
           ConvCase{1, 16, 32, 32, 32, 3, 3, 2, 2, 1, 1, true},  // a stride-2 transition
           ConvCase{1, 16, 32, 32, 32, 1, 1, 2, 2, 0, 0, false}, // a 1 × 1 shortcut (read in place)
           ConvCase{2, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, true},    // 4 blocks of 16 output channels
           ConvCase{3, 20, 6, 23, 37, 3, 3, 2, 2, 1, 1, false},  // channel and pixel tails
           ConvCase{1, 5, 5, 5, 3, 5, 5, 1, 1, 2, 2, true},      // a 5 × 5 kernel, fewer than 16 outputs
           ConvCase{4, 30, 1, 1, 10, 1, 1, 1, 1, 0, 0, false},   // a linear layer as a 1 × 1 convolution
           ConvCase{1, 48, 3, 17, 80, 3, 3, 1, 1, 0, 0, true},   // 5 blocks: 4 + 1, read in place
           ConvCase{2, 8, 9, 14, 24, 3, 5, 2, 1, 0, 2, false},   // non-square kernel, strides, padding
           ConvCase{3, 12, 7, 9, 17, 1, 3, 1, 3, 2, 0, true},    // and the other way round, in place
       })
    check_conv_case(c);
  at::set_num_threads(threads);
}

// One input channel, a 1 × 1 kernel with code 1, all scales 1 but s_y = 2: each output is
// round_half_even(a/2 + c), so the ties fall on known codes.
TEST(Int8Conv, HandWorkedTiesAndClamps) {
  Int8ConvShape s;
  s.in_channels = 1;
  s.out_channels = 1;
  const int8_t w = 1;
  const float w_scale = 1.0f, bias = 0.0f;
  // x codes with z_x = 10: a = q_x − 10 = 5, 7, −3, 0, 245.
  const std::vector<uint8_t> x = {15, 17, 7, 10, 255};
  for (Int8Variant v : supported_variants()) {
    SCOPED_TRACE(kernels::int8_variant_name(v));
    const Int8Conv2d conv(s, &w, &w_scale, &bias, v);
    std::vector<uint8_t> y(5);
    // z_y = 3: 2.5 + 3 = 5.5 → 6 (even), 3.5 + 3 = 6.5 → 6, −1.5 + 3 = 1.5 → 2, 3, 122.5 + 3 → 126.
    conv.run(x.data(), 1, 1, 5, 1.0f, 10, y.data(), 2.0f, 3, false);
    EXPECT_EQ(y, (std::vector<uint8_t>{6, 6, 2, 3, 126}));
    // With ReLU the lowest code is z_y; −1.5 + 1 = −0.5 → 0 clamps at 1.
    conv.run(x.data(), 1, 1, 5, 1.0f, 10, y.data(), 2.0f, 1, true);
    EXPECT_EQ(y, (std::vector<uint8_t>{4, 4, 1, 1, 124}));
    // s_y small: everything above the top code clamps at 255, below 0 at 0.
    conv.run(x.data(), 1, 1, 5, 1.0f, 10, y.data(), 0.01f, 0, false);
    EXPECT_EQ(y, (std::vector<uint8_t>{255, 255, 0, 0, 255}));
  }
}

// A padded tap reads the zero point (real 0): a 3 × 3 kernel of ones on a 1 × 1 map of code z_x + 4
// sums 4 at the centre tap only.
TEST(Int8Conv, PaddingAddsNothing) {
  Int8ConvShape s;
  s.in_channels = 1;
  s.out_channels = 2;
  s.kernel_h = s.kernel_w = 3;
  s.pad_h = s.pad_w = 1;
  std::vector<int8_t> w(18, 1);
  w[9 + 4] = -3;  // channel 1's centre
  const std::vector<float> w_scale = {1.0f, 1.0f}, bias = {0.0f, 0.0f};
  const std::vector<uint8_t> x = {104};
  for (Int8Variant v : supported_variants()) {
    SCOPED_TRACE(kernels::int8_variant_name(v));
    const Int8Conv2d conv(s, w.data(), w_scale.data(), bias.data(), v);
    std::vector<uint8_t> y(2);
    conv.run(x.data(), 1, 1, 1, 1.0f, 100, y.data(), 1.0f, 50, false);
    EXPECT_EQ(y, (std::vector<uint8_t>{54, 38}));  // 4 + 50, −12 + 50
  }
}

TEST(Int8Add, EveryVariantEqualsTheFormula) {
  at::manual_seed(4);
  for (int64_t n : {1, 7, 16, 33, 1000, 40000}) {
    const at::Tensor a = at::randint(0, 256, {n}, at::kByte), b = at::randint(0, 256, {n}, at::kByte);
    for (bool relu : {false, true}) {
      const float sa = 0.05f, sb = 0.031f, sy = 0.07f;
      const int32_t za = 20, zb = 140, zy = 90;
      const float ma = static_cast<float>(double(sa) / sy), mb = static_cast<float>(double(sb) / sy);
      const float c = static_cast<float>(zy - za * double(ma) - zb * double(mb));
      std::vector<uint8_t> expected(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float s = static_cast<float>(a[i].item<uint8_t>()) * ma + static_cast<float>(b[i].item<uint8_t>()) * mb;
        const float u = s + c;
        expected[i] = static_cast<uint8_t>(
            std::min(255.0f, std::max(relu ? float(zy) : 0.0f, std::nearbyint(std::min(256.0f, std::max(-1.0f, u))))));
        // Within one code of the real sum.
        const double real = (sa * (a[i].item<uint8_t>() - za) + sb * (b[i].item<uint8_t>() - zb)) / sy + zy;
        ASSERT_LE(std::abs(std::min(255.0, std::max(relu ? double(zy) : 0.0, std::nearbyint(real))) - expected[i]), 1.0);
      }
      for (Int8Variant v : supported_variants()) {
        SCOPED_TRACE(kernels::int8_variant_name(v) + " n " + std::to_string(n));
        std::vector<uint8_t> got(static_cast<size_t>(n));
        kernels::int8_add(a.data_ptr<uint8_t>(), sa, za, b.data_ptr<uint8_t>(), sb, zb, got.data(), sy, zy, relu, n, v);
        EXPECT_EQ(got, expected);
      }
    }
  }
}

// Hand-worked: (0.5·(30 − 10) + 0.25·(8 − 0))/1 + 2 = 14; the tie 0.5·(11 − 10) + 2 = 2.5 → 2.
TEST(Int8Add, HandWorked) {
  const std::vector<uint8_t> a = {30, 11, 0}, b = {8, 0, 0};
  for (Int8Variant v : supported_variants()) {
    std::vector<uint8_t> y(3);
    kernels::int8_add(a.data(), 0.5f, 10, b.data(), 0.25f, 0, y.data(), 1.0f, 2, false, 3, v);
    EXPECT_EQ(y, (std::vector<uint8_t>{14, 2, 0})) << kernels::int8_variant_name(v);  // −5 + 2 → 0
    kernels::int8_add(a.data(), 0.5f, 10, b.data(), 0.25f, 0, y.data(), 1.0f, 2, true, 3, v);
    EXPECT_EQ(y, (std::vector<uint8_t>{14, 2, 2})) << kernels::int8_variant_name(v);
  }
}

// Quantization to channels-last codes: round half to even of x/s, the zero point added, clamped
// (at the zero point with ReLU), NaN to the lowest code; [N][C][HW] in, [N][HW][C] out.
TEST(Int8Quantize, HandWorkedChannelsLast) {
  // One image, 2 channels × 3 positions; s = 0.5, z = 10.
  const std::vector<float> x = {0.25f, 0.75f, -6.0f,                                  // channel 0
                                1.0f, 200.0f, std::numeric_limits<float>::quiet_NaN()};  // channel 1
  std::vector<uint8_t> y(6);
  kernels::int8_quantize_channels_last(x.data(), 1, 2, 3, 0.5f, 10, false, y.data());
  // 0.5 → 0 (even) + 10, 1.5 → 2 + 10, −12 + 10 → 0; 2 + 10, 400 → 255, NaN → 0.
  EXPECT_EQ(y, (std::vector<uint8_t>{10, 12, 12, 255, 0, 0}));
  kernels::int8_quantize_channels_last(x.data(), 1, 2, 3, 0.5f, 10, true, y.data());
  EXPECT_EQ(y, (std::vector<uint8_t>{10, 12, 12, 255, 10, 10}));
  expect_error_contains([&] { kernels::int8_quantize_channels_last(x.data(), 1, 2, 3, 0.0f, 10, false, y.data()); },
                        "quantizer scale");
}

TEST(Int8Conv, RequantizationOfAnotherLayerIsRefused) {
  Int8ConvShape s;
  s.in_channels = 4;
  s.out_channels = 2;
  const std::vector<int8_t> w(8, 1);
  const std::vector<float> scale = {1.0f, 1.0f}, wide_scale(20, 1.0f);
  const Int8Conv2d conv(s, w.data(), scale.data(), nullptr, Int8Variant::kScalar);
  Int8ConvShape other = s;
  other.out_channels = 20;
  const std::vector<int8_t> wo(80, 1);
  const Int8Conv2d wide(other, wo.data(), wide_scale.data(), nullptr, Int8Variant::kScalar);
  std::vector<uint8_t> x(4), y(2);
  expect_error_contains([&] { conv.run(x.data(), 1, 1, 1, wide.requantization(1.0f, 0, 1.0f, 0, false), y.data()); },
                        "made for a layer of 20 output channels, not this one's 2");
  Int8Conv2d::Requantization cut = conv.requantization(1.0f, 0, 1.0f, 0, false);
  cut.c.resize(3);
  expect_error_contains([&] { conv.run(x.data(), 1, 1, 1, cut, y.data()); }, "made for a layer");
  // Codes and floats are not mixed up.
  std::vector<float> yf(2);
  expect_error_contains([&] { conv.run(x.data(), 1, 1, 1, conv.requantization(1.0f, 0, 1.0f, 0, false), yf.data()); },
                        "writes codes, not floats");
  expect_error_contains([&] { conv.run(x.data(), 1, 1, 1, conv.dequantization(1.0f, 0), y.data()); },
                        "writes floats, not codes");
  // An empty batch writes nothing.
  conv.run(x.data(), 0, 1, 1, conv.requantization(1.0f, 0, 1.0f, 0, false), y.data());
}

TEST(Int8Conv, BadInputIsNamed) {
  Int8ConvShape s;
  s.in_channels = 4;
  s.out_channels = 2;
  s.kernel_h = s.kernel_w = 3;
  const std::vector<int8_t> w(72, 1);
  const std::vector<float> scale = {1.0f, 1.0f};
  const Int8Conv2d conv(s, w.data(), scale.data(), nullptr, Int8Variant::kScalar);
  std::vector<uint8_t> x(4 * 2 * 2), y(8);
  expect_error_contains([&] { conv.run(x.data(), 1, 2, 2, 1.0f, 0, y.data(), 1.0f, 0, false); }, "kernel height 3");
  expect_error_contains([&] { conv.run(x.data(), 1, 3, 3, 1.0f, 300, y.data(), 1.0f, 0, false); },
                        "input zero point 300");
  expect_error_contains([&] { conv.run(x.data(), 1, 3, 3, 1.0f, 0, y.data(), 0.0f, 0, false); }, "output scale");
  Int8ConvShape big = s;
  big.in_channels = 8192;
  const std::vector<int8_t> wb(2 * 8192 * 9, 0);
  expect_error_contains([&] { Int8Conv2d(big, wb.data(), scale.data(), nullptr, Int8Variant::kScalar); }, "overflow");
  Int8ConvShape empty = s;
  empty.out_channels = 0;
  expect_error_contains([&] { Int8Conv2d(empty, w.data(), scale.data(), nullptr, Int8Variant::kScalar); }, "positive");
  const std::vector<float> bad_scale = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  expect_error_contains([&] { Int8Conv2d(s, w.data(), bad_scale.data(), nullptr, Int8Variant::kScalar); },
                        "weight scale nan of output channel 1");
  const std::vector<float> bad_bias = {std::numeric_limits<float>::infinity(), 0.0f};
  expect_error_contains([&] { Int8Conv2d(s, w.data(), scale.data(), bad_bias.data(), Int8Variant::kScalar); },
                        "bias of output channel 0 is not finite");
}

}  // namespace
}  // namespace whittle
