// Bitpacked kernels (kernels/): each optimized variant against its plain reference, exactly.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "fuse/fold_math.h"
#include "kernels/binary_conv.h"
#include "kernels/bitpack.h"
#include "kernels/bitplane.h"
#include "kernels/isa.h"
#include "kernels/popcount_gemm.h"
#include "support.h"

namespace whittle {
namespace {

using kernels::Isa;

// Restores the instruction set a test changed.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) : saved_(kernels::active_isa()) { kernels::set_isa(isa); }
  ~IsaScope() { kernels::set_isa(saved_); }

 private:
  Isa saved_;
};

// ±1-valued float tensor with some exact zeros (sign(0) = +1 must hold through every path).
at::Tensor signs_with_zeros(at::IntArrayRef shape) {
  at::Tensor x = at::randn(shape);
  return at::where(at::rand(shape) < 0.1, at::zeros_like(x), x);
}

TEST(KernelsIsa, NamesParseAndScalarIsAlwaysSupported) {
  EXPECT_EQ(kernels::parse_isa("avx2"), Isa::kAvx2);
  EXPECT_EQ(kernels::isa_name(Isa::kAvx512), "avx512");
  EXPECT_TRUE(kernels::isa_supported(Isa::kScalar));
  EXPECT_THROW(kernels::parse_isa("neon"), Error);
  EXPECT_FALSE(kernels::supported_isas().empty());
}

TEST(BitPack, MatchesReferenceAndRoundTrips) {
  at::manual_seed(0);
  for (int64_t c : {1, 63, 64, 65, 127, 128, 129}) {
    SCOPED_TRACE("C = " + std::to_string(c));
    at::Tensor x = signs_with_zeros({3, c, 4, 5});
    at::Tensor packed = kernels::pack_signs(x);
    ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{3, 4, 5, kernels::words_for(c)}));
    EXPECT_TRUE(at::equal(packed, kernels::pack_signs_reference(x)));
    EXPECT_TRUE(at::equal(kernels::unpack_signs(packed, c), at::where(x >= 0, 1.0, -1.0).to(at::kFloat)));
    at::Tensor m = signs_with_zeros({2, c});
    EXPECT_TRUE(at::equal(kernels::pack_signs(m), kernels::pack_signs_reference(m)));
    EXPECT_TRUE(at::equal(kernels::unpack_signs(kernels::pack_signs(m), c), at::where(m >= 0, 1.0, -1.0).to(at::kFloat)));
    // Non-contiguous and double inputs pack the same signs.
    at::Tensor strided = x.transpose(2, 3).contiguous().transpose(2, 3);
    EXPECT_TRUE(at::equal(kernels::pack_signs(strided), packed));
    EXPECT_TRUE(at::equal(kernels::pack_signs(x.to(at::kDouble)), packed));
  }
}

TEST(BitPack, HandWorkedWords) {
  // Channels 0..69 of one pixel: negative at 0, 2, 63 and 64; zero at 1 (sign(0) = +1, bit 0); −0.0 at 3.
  at::Tensor x = at::ones({1, 70});
  x[0][0] = -1.0;
  x[0][1] = 0.0;
  x[0][2] = -0.5;
  x[0][3] = -0.0;
  x[0][63] = -2.0;
  x[0][64] = -3.0;
  at::Tensor p = kernels::pack_signs(x);
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(static_cast<uint64_t>(p[0][0].item<int64_t>()), (uint64_t{1} << 0) | (uint64_t{1} << 2) | (uint64_t{1} << 63));
  EXPECT_EQ(p[0][1].item<int64_t>(), 1);  // channel 64; padding bits 65..127 stay 0
}

TEST(BitPack, NanPacksAsMinusOneAndNegativeZeroAsPlusOne) {
  // As quantize::bnn_sign: +1 where x ≥ 0 (−0.0 included), −1 elsewhere (NaN included).
  at::Tensor x = at::ones({1, 3, 1, 2});
  x[0][0][0][0] = std::numeric_limits<float>::quiet_NaN();
  x[0][1][0][0] = -0.0f;
  x[0][2][0][1] = -2.0f;
  for (const at::Tensor& p : {kernels::pack_signs(x), kernels::pack_signs_reference(x)}) {
    EXPECT_EQ(p[0][0][0][0].item<int64_t>(), 0b001);  // channel 0 NaN → 1; channel 1 −0.0 → 0
    EXPECT_EQ(p[0][0][1][0].item<int64_t>(), 0b100);  // channel 2 −2 → 1
  }
  EXPECT_EQ(kernels::pack_signs(x.flatten(2).select(2, 0))[0][0].item<int64_t>(), 0b001);  // the [N, C] path
}

TEST(BitPack, RefusesWhatItCannotPack) {
  EXPECT_THROW(kernels::pack_signs(at::ones({2, 3, 4})), Error);
  EXPECT_THROW(kernels::pack_signs(at::ones({2, 3}, at::kInt)), Error);
  EXPECT_THROW(kernels::unpack_signs(at::zeros({2, 3}, at::kLong), 64), Error);
}

// The popcount GEMM of every supported variant equals the scalar one, for XOR and AND, across the
// vector widths' edges: K words 0..9, 31 ± 1 and 62/63 (the AVX2 byte-counter flush every 31
// steps), 124 and 300; column tails of 4, 8 and 32 lanes; B exactly K × N (ldb = N), so a load
// past the last column would read outside the tensor (visible under AddressSanitizer).
TEST(PopcountGemm, EveryVariantEqualsScalar) {
  at::manual_seed(0);
  for (Isa isa : kernels::supported_isas()) {
    IsaScope scope(isa);
    for (int64_t k : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 30, 31, 32, 62, 63, 124, 300})
      for (auto [m, n] : std::vector<std::pair<int64_t, int64_t>>{
               {0, 3}, {3, 0}, {1, 1}, {3, 5}, {4, 4}, {2, 6}, {3, 7}, {4, 8}, {7, 9}, {5, 16}, {4, 24},
               {5, 32}, {6, 40}, {4, 45}, {5, 48}, {2, 67}}) {
        SCOPED_TRACE(kernels::isa_name(isa) + " K=" + std::to_string(k) + " M=" + std::to_string(m) + " N=" + std::to_string(n));
        at::Tensor a = at::randint(INT64_MIN, INT64_MAX, {m, k + 1}, at::kLong);
        at::Tensor b = at::randint(INT64_MIN, INT64_MAX, {k, n}, at::kLong);  // K-major, ldb = N
        for (auto op : {kernels::detail::BitOp::kXor, kernels::detail::BitOp::kAnd}) {
          at::Tensor got = at::full({m, n + 3}, -7, at::kInt), want = at::full({m, n + 3}, -7, at::kInt);
          auto* A = reinterpret_cast<const uint64_t*>(a.data_ptr<int64_t>());
          auto* B = reinterpret_cast<const uint64_t*>(b.data_ptr<int64_t>());
          kernels::detail::popcount_gemm()(op, A, k + 1, B, n, m, n, k, got.data_ptr<int32_t>(), n + 3);
          kernels::detail::popcount_gemm_scalar(op, A, k + 1, B, n, m, n, k, want.data_ptr<int32_t>(), n + 3);
          EXPECT_TRUE(at::equal(got, want));
        }
      }
  }
}

// All-ones operands: every byte of every step counts 8, the most a byte counter takes, so a flush
// one step too late would overflow. popcount = 64·K exactly.
TEST(PopcountGemm, FullWordsDoNotOverflowByteCounters) {
  for (Isa isa : kernels::supported_isas()) {
    IsaScope scope(isa);
    for (int64_t k : {31, 32, 62, 63, 124, 125, 1000}) {
      SCOPED_TRACE(kernels::isa_name(isa) + " K=" + std::to_string(k));
      std::vector<uint64_t> ones_a(static_cast<size_t>(4 * k), ~uint64_t{0}), ones_b(static_cast<size_t>(k * 9), ~uint64_t{0});
      std::vector<uint64_t> zeros_b(static_cast<size_t>(k * 9), 0);
      std::vector<int32_t> c(36, 0);
      kernels::detail::popcount_gemm()(kernels::detail::BitOp::kAnd, ones_a.data(), k, ones_b.data(), 9, 4, 9, k, c.data(), 9);
      for (int32_t v : c) EXPECT_EQ(v, 64 * k);
      kernels::detail::popcount_gemm()(kernels::detail::BitOp::kXor, ones_a.data(), k, zeros_b.data(), 9, 4, 9, k, c.data(), 9);
      for (int32_t v : c) EXPECT_EQ(v, 64 * k);
    }
  }
}

TEST(PopcountGemm, HandWorked) {
  const uint64_t a[2] = {0xFFull, 0x1ull};   // 9 ones
  const uint64_t b[2] = {0x0Full, 0x3ull};   // 6 ones (K-major: one column, ldb 1)
  int32_t c = 0;
  kernels::detail::popcount_gemm_scalar(kernels::detail::BitOp::kXor, a, 2, b, 1, 1, 1, 2, &c, 1);
  EXPECT_EQ(c, 4 + 1);  // 0xF0 and 0x2
  kernels::detail::popcount_gemm_scalar(kernels::detail::BitOp::kAnd, a, 2, b, 1, 1, 1, 2, &c, 1);
  EXPECT_EQ(c, 4 + 1);  // 0x0F and 0x1
}

// Binary convolution: the optimized kernel (every supported variant) equals the plain reference
// exactly, over input channels K, output channels, strides, padding and batch.
class BinaryConvEdges : public ::testing::TestWithParam<std::tuple<Isa, int64_t>> {};

TEST_P(BinaryConvEdges, OptimizedEqualsReference) {
  const auto [isa, in_channels] = GetParam();
  IsaScope scope(isa);
  at::manual_seed(in_channels);
  for (int64_t out_channels : {1, 7, 8, 9})
    for (int64_t stride : {1, 2})
      for (int64_t pad : {0, 1})
        for (int64_t batch : {1, 3}) {
          SCOPED_TRACE("O=" + std::to_string(out_channels) + " stride=" + std::to_string(stride) + " pad=" +
                       std::to_string(pad) + " N=" + std::to_string(batch));
          at::Tensor x = signs_with_zeros({batch, in_channels, 6, 5});
          at::Tensor w = signs_with_zeros({out_channels, in_channels, 3, 3});
          kernels::BinaryConv2dOptions opt{stride, stride, pad, pad};
          at::Tensor want = kernels::binary_conv2d_reference(x, w, opt);
          at::Tensor got = kernels::binary_conv2d_dot(kernels::pack_signs(x), kernels::pack_binary_weight(w), opt);
          ASSERT_TRUE(at::equal(got, want)) << (got - want).abs().max().item<int>();
          // 1×1 (the direct path at stride 1, no padding).
          at::Tensor w1 = signs_with_zeros({out_channels, in_channels, 1, 1});
          kernels::BinaryConv2dOptions opt1{stride, stride, 0, 0};
          EXPECT_TRUE(at::equal(kernels::binary_conv2d_dot(kernels::pack_signs(x), kernels::pack_binary_weight(w1), opt1),
                                kernels::binary_conv2d_reference(x, w1, opt1)));
        }
}

std::vector<std::tuple<Isa, int64_t>> conv_edges() {
  std::vector<std::tuple<Isa, int64_t>> out;
  for (Isa isa : kernels::supported_isas())
    for (int64_t k : {1, 63, 64, 65, 127, 128, 129}) out.emplace_back(isa, k);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, BinaryConvEdges, ::testing::ValuesIn(conv_edges()),
                         [](const ::testing::TestParamInfo<std::tuple<Isa, int64_t>>& info) {
                           return kernels::isa_name(std::get<0>(info.param)) + "_K" + std::to_string(std::get<1>(info.param));
                         });

// A layer big enough to be split across threads gives the reference's dots, for every variant.
TEST(BinaryConv, ThreadedLayerEqualsReference) {
  at::manual_seed(4);
  at::Tensor x = signs_with_zeros({2, 130, 12, 12}), w = signs_with_zeros({70, 130, 3, 3});
  const int saved = at::get_num_threads();
  at::set_num_threads(2);
  at::Tensor want = kernels::binary_conv2d_reference(x, w, {1, 1, 1, 1});
  for (Isa isa : kernels::supported_isas()) {
    IsaScope scope(isa);
    EXPECT_TRUE(at::equal(kernels::binary_conv2d_dot(kernels::pack_signs(x), kernels::pack_binary_weight(w), {1, 1, 1, 1}), want))
        << kernels::isa_name(isa);
  }
  at::set_num_threads(saved);
}

// Unequal kernel sides, strides and paddings (an h/w mix-up would show), padding 2, 40 outputs.
TEST(BinaryConv, NonSquareOptionsEqualReference) {
  at::manual_seed(5);
  at::Tensor x = signs_with_zeros({2, 70, 7, 9}), w = signs_with_zeros({40, 70, 3, 2});
  for (Isa isa : kernels::supported_isas()) {
    IsaScope scope(isa);
    for (kernels::BinaryConv2dOptions opt : {kernels::BinaryConv2dOptions{2, 1, 1, 0}, kernels::BinaryConv2dOptions{1, 3, 0, 2},
                                             kernels::BinaryConv2dOptions{1, 1, 2, 2}}) {
      SCOPED_TRACE(kernels::isa_name(isa) + " stride " + std::to_string(opt.stride_h) + "," + std::to_string(opt.stride_w) +
                   " pad " + std::to_string(opt.pad_h) + "," + std::to_string(opt.pad_w));
      at::Tensor want = kernels::binary_conv2d_reference(x, w, opt);
      at::Tensor xs = at::where(x >= 0, 1.0, -1.0).to(at::kFloat), ws = at::where(w >= 0, 1.0, -1.0).to(at::kFloat);
      ASSERT_TRUE(at::equal(want.to(at::kFloat), at::conv2d(xs, ws, {}, {opt.stride_h, opt.stride_w}, {opt.pad_h, opt.pad_w})));
      EXPECT_TRUE(at::equal(kernels::binary_conv2d_dot(kernels::pack_signs(x), kernels::pack_binary_weight(w), opt), want));
    }
  }
}

// The reference itself against ATen's float convolution of the binarized tensors (zero padding).
TEST(BinaryConv, ReferenceEqualsFloatConvolutionOfSigns) {
  at::manual_seed(1);
  at::Tensor x = signs_with_zeros({2, 5, 7, 6}), w = signs_with_zeros({4, 5, 3, 3});
  at::Tensor xs = at::where(x >= 0, 1.0, -1.0).to(at::kFloat), ws = at::where(w >= 0, 1.0, -1.0).to(at::kFloat);
  at::Tensor want = at::conv2d(xs, ws, {}, {2, 1}, {1, 1});
  at::Tensor got = kernels::binary_conv2d_reference(x, w, {2, 1, 1, 1});
  EXPECT_TRUE(at::equal(got.to(at::kFloat), want));
}

TEST(BinaryConv, HandWorkedPadding) {
  // 1 channel 2×2 input of +1, one 3×3 kernel of +1, padding 1: each output sees 4 inputs.
  at::Tensor x = at::ones({1, 1, 2, 2}), w = at::ones({1, 1, 3, 3});
  at::Tensor got = kernels::binary_conv2d_dot(kernels::pack_signs(x), kernels::pack_binary_weight(w), {1, 1, 1, 1});
  EXPECT_TRUE(at::equal(got, at::full({1, 1, 2, 2}, 4, at::kInt)));
  // Kernel of −1 except the centre: output (0, 0) sees the centre (+1) and three −1 taps: 1 − 3 = −2.
  at::Tensor w2 = -at::ones({1, 1, 3, 3});
  w2[0][0][1][1] = 1.0;
  got = kernels::binary_conv2d_dot(kernels::pack_signs(x), kernels::pack_binary_weight(w2), {1, 1, 1, 1});
  EXPECT_EQ(got[0][0][0][0].item<int>(), -2);
}

TEST(BinaryConv, EpiloguesScaleBiasAndThreshold) {
  at::manual_seed(2);
  const int64_t C = 70, O = 67;
  at::Tensor x = signs_with_zeros({2, C, 5, 5}), w = signs_with_zeros({O, C, 3, 3});
  kernels::PackedBinaryWeight pw = kernels::pack_binary_weight(w);
  kernels::BinaryConv2dOptions opt{1, 1, 1, 1};
  at::Tensor dot = kernels::binary_conv2d_dot(kernels::pack_signs(x), pw, opt).to(at::kFloat);
  at::Tensor scale = at::rand({O}) + 0.5, bias = at::randn({O});
  at::Tensor y = kernels::binary_conv2d(kernels::pack_signs(x), pw, opt, {scale, bias, {}, {}});
  at::Tensor want = dot * scale.view({1, O, 1, 1}) + bias.view({1, O, 1, 1});
  // Tolerance 0: both sides round one float multiply, then one add, per element (the dots are
  // exact integers; the kernel's unit is built for baseline x86-64 under -std=c++17, so GCC does
  // not contract them into an FMA). Held with OMP_NUM_THREADS=1, ATEN_CPU_CAPABILITY=default and
  // WHITTLE_KERNEL_ISA=scalar|avx2|avx512.
  EXPECT_TRUE(test::all_close(y, want, 0, 0));
  // Threshold: +1 where (y − τ)·d ≥ 0 (fuse's apply_sign_threshold), packed for the next layer.
  at::Tensor threshold = at::randn({O}) * 10, direction = at::where(at::rand({O}) < 0.3, -1.0, 1.0).to(at::kFloat);
  threshold[0] = -std::numeric_limits<float>::infinity();  // γ = 0, β ≥ 0: always +1
  threshold[1] = std::numeric_limits<float>::infinity();   // γ = 0, β < 0: always −1
  direction[0] = direction[1] = 1.0;
  at::Tensor packed = kernels::binary_conv2d(kernels::pack_signs(x), pw, opt, {scale, bias, threshold, direction});
  at::Tensor signs = fuse::apply_sign_threshold(want, threshold, direction);
  EXPECT_TRUE(at::equal(packed, kernels::pack_signs(signs)));
  EXPECT_TRUE(at::equal(kernels::unpack_signs(packed, O).select(1, 0), at::ones({2, 5, 5})));
  EXPECT_TRUE(at::equal(kernels::unpack_signs(packed, O).select(1, 1), -at::ones({2, 5, 5})));
}

TEST(BinaryLinear, EqualsMatmulOfSignsForEveryVariant) {
  at::manual_seed(3);
  for (Isa isa : kernels::supported_isas()) {
    IsaScope scope(isa);
    for (int64_t c : {1, 63, 64, 65, 129, 800})
      for (int64_t o : {1, 9, 33}) {
        SCOPED_TRACE(kernels::isa_name(isa) + " C=" + std::to_string(c) + " O=" + std::to_string(o));
        at::Tensor x = signs_with_zeros({3, c}), w = signs_with_zeros({o, c});
        at::Tensor want = at::matmul(at::where(x >= 0, 1.0, -1.0), at::where(w >= 0, 1.0, -1.0).t()).to(at::kInt);
        kernels::PackedBinaryWeight pw = kernels::pack_binary_weight(w);
        EXPECT_TRUE(at::equal(kernels::binary_linear_dot(kernels::pack_signs(x), pw), want));
        at::Tensor scale = at::rand({o});
        EXPECT_TRUE(test::all_close(kernels::binary_linear(kernels::pack_signs(x), pw, {scale, {}, {}, {}}),
                                    want.to(at::kFloat) * scale, 0, 0));
      }
  }
}

// Linear: bias and the packed threshold epilogue; a layer large enough to be split across
// threads by blocks of output channels (block starts not multiples of 8).
TEST(BinaryLinear, EpiloguesAndThreadedSplit) {
  at::manual_seed(6);
  const int saved = at::get_num_threads();
  at::set_num_threads(2);
  at::Tensor x = signs_with_zeros({64, 4096}), w = signs_with_zeros({40, 4096});
  at::Tensor want = at::matmul(at::where(x >= 0, 1.0, -1.0), at::where(w >= 0, 1.0, -1.0).t()).to(at::kFloat);
  kernels::PackedBinaryWeight pw = kernels::pack_binary_weight(w);
  at::Tensor scale = at::rand({40}) + 0.5, bias = at::randn({40}) * 5;
  at::Tensor threshold = at::randn({40}) * 20, direction = at::where(at::rand({40}) < 0.5, -1.0, 1.0).to(at::kFloat);
  for (Isa isa : kernels::supported_isas()) {
    IsaScope scope(isa);
    SCOPED_TRACE(kernels::isa_name(isa));
    EXPECT_TRUE(at::equal(kernels::binary_linear_dot(kernels::pack_signs(x), pw).to(at::kFloat), want));
    at::Tensor y = want * scale + bias;
    EXPECT_TRUE(test::all_close(kernels::binary_linear(kernels::pack_signs(x), pw, {scale, bias, {}, {}}), y, 0, 0));
    EXPECT_TRUE(at::equal(kernels::binary_linear(kernels::pack_signs(x), pw, {scale, bias, threshold, direction}),
                          kernels::pack_signs(fuse::apply_sign_threshold(y, threshold, direction))));
  }
  at::set_num_threads(saved);
}

TEST(BinaryConv, BadInputIsNamed) {
  at::Tensor w = at::ones({4, 70, 3, 3});
  kernels::PackedBinaryWeight pw = kernels::pack_binary_weight(w);
  try {
    kernels::binary_conv2d_dot(kernels::pack_signs(at::ones({1, 64, 5, 5})), pw);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("70 input channels"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kernels::binary_conv2d_dot(kernels::pack_signs(at::ones({1, 70, 2, 2})), pw), Error);  // 2×2 < 3×3
  EXPECT_THROW(kernels::binary_conv2d(kernels::pack_signs(at::ones({1, 70, 5, 5})), pw, {}, {at::ones({3}), {}, {}, {}}),
               Error);
  EXPECT_THROW(kernels::binary_linear_dot(kernels::pack_signs(at::ones({1, 70})), pw), Error);  // a conv weight
  EXPECT_THROW(kernels::conv_output_size(5, 3, 0, 1), Error);                                      // stride 0
  EXPECT_THROW(kernels::binary_conv2d_reference(at::ones({1, 2, 5, 5}), at::ones({1, 2, 3, 3}), {0, 1, 0, 0}), Error);
  EXPECT_THROW(kernels::binary_conv2d(kernels::pack_signs(at::ones({1, 70, 5, 5})), pw, {},
                                      {{}, {}, at::zeros({4}), {}}),  // a threshold without a direction
               Error);
  kernels::PackedBinaryWeight broken = pw;
  broken.out_channels = 5;  // does not match its words
  EXPECT_THROW(kernels::binary_conv2d_dot(kernels::pack_signs(at::ones({1, 70, 5, 5})), broken), Error);
  try {
    kernels::pack_binary_weight(at::ones({4, 3, 3, 3}, at::kInt));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pack_binary_weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kernels::unpack_signs(at::zeros({2, 0}, at::kLong), 0), Error);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!kernels::isa_supported(isa)) {
      EXPECT_THROW(kernels::set_isa(isa), Error);
    }
  }
}

// ---- bit-plane kernels: AND + popcount over activation and weight planes, against at::conv2d in
// float64 of the codes and weight values (exact: the values are small integers or have few bits).

// Random codes in [0, 2^bits).
at::Tensor random_codes(at::IntArrayRef shape, int64_t bits) {
  return at::randint(0, int64_t{1} << bits, shape, at::kLong).to(at::kFloat);
}

// A weight of TWN ternary values {−1, 0, +1} as planes w⁺, w⁻ (coefficients +1, −1) and its values.
std::pair<kernels::PackedBitplaneWeight, at::Tensor> ternary_weight(at::IntArrayRef shape) {
  const at::Tensor code = at::randint(0, 3, shape, at::kLong);
  const at::Tensor plus = code.eq(2).to(at::kFloat), minus = code.eq(0).to(at::kFloat);
  return {kernels::pack_bitplane_weight({plus, minus}, {1.0, -1.0}, 0.0), plus - minus};
}

// DoReFa 2-bit weights 2c/3 − 1: the two bits of c with coefficients 2/3, 4/3, offset −1.
std::pair<kernels::PackedBitplaneWeight, at::Tensor> dorefa2_weight(at::IntArrayRef shape) {
  const at::Tensor c = at::randint(0, 4, shape, at::kLong);
  const at::Tensor b0 = c.bitwise_and(1).to(at::kFloat), b1 = c.bitwise_right_shift(1).to(at::kFloat);
  return {kernels::pack_bitplane_weight({b0, b1}, {2.0 / 3, 4.0 / 3}, -1.0), c.to(at::kDouble) * (2.0 / 3) - 1};
}

TEST(Bitplane, PackBitplanesHoldsEachBit) {
  const at::Tensor codes = random_codes({2, 70, 3, 4}, 3);
  const at::Tensor planes = kernels::pack_bitplanes(codes, 3);
  ASSERT_EQ(planes.sizes(), (std::vector<int64_t>{3, 2, 3, 4, 2}));
  for (int64_t j = 0; j < 3; ++j) {
    const at::Tensor bit = codes.to(at::kLong).bitwise_right_shift(j).bitwise_and(1);
    EXPECT_TRUE(kernels::unpack_signs(planes[j], 70).eq(-1).equal(bit.eq(1))) << "plane " << j;
  }
  EXPECT_THROW(kernels::pack_bitplanes(codes, 2), Error);              // code 7 needs 3 bits
  EXPECT_THROW(kernels::pack_bitplanes(codes + 0.5, 3), Error);        // not integers
  EXPECT_THROW(kernels::pack_bitplanes(codes, 9), Error);
  EXPECT_THROW(kernels::pack_bitplanes(codes.flatten(), 3), Error);    // rank 1
}

struct BitplaneCase {
  int64_t channels, out, kernel, stride, pad, batch, activation_bits;
};

TEST(Bitplane, ConvEqualsFloatConvolutionOfTheValues) {
  const std::vector<BitplaneCase> cases = {
      {1, 1, 3, 1, 1, 1, 2},  {63, 7, 3, 1, 1, 3, 2}, {64, 8, 3, 2, 1, 1, 2}, {65, 9, 3, 1, 0, 3, 1},
      {127, 8, 1, 1, 0, 2, 4}, {129, 9, 3, 2, 1, 1, 3}, {128, 16, 5, 1, 2, 1, 2},
  };
  for (Isa isa : kernels::supported_isas()) {
    IsaScope scope(isa);
    for (const BitplaneCase& c : cases) {
      for (int form = 0; form < 2; ++form) {
        const auto [w, values] = form == 0 ? ternary_weight({c.out, c.channels, c.kernel, c.kernel})
                                           : dorefa2_weight({c.out, c.channels, c.kernel, c.kernel});
        const at::Tensor a = random_codes({c.batch, c.channels, 9, 8}, c.activation_bits);
        const at::Tensor scale = at::rand({c.out}) + 0.5, bias = at::randn({c.out});
        kernels::BinaryEpilogue e;
        e.scale = scale;
        e.bias = bias;
        const at::Tensor got = kernels::bitplane_conv2d(kernels::pack_bitplanes(a, c.activation_bits), w,
                                                        {c.stride, c.stride, c.pad, c.pad}, e);
        const at::Tensor dot = at::conv2d(a.to(at::kDouble), values.to(at::kDouble), {}, c.stride, c.pad);
        const at::Tensor expected = (dot * scale.to(at::kDouble).view({1, -1, 1, 1}) + bias.to(at::kDouble).view({1, -1, 1, 1}));
        // float32 output of exact integer sums (ternary) or sums with thirds (DoReFa): float rounding only.
        EXPECT_TRUE(test::all_close(got, expected, 1e-4, 1e-6))
            << kernels::isa_name(isa) << (form == 0 ? " ternary" : " dorefa2") << " C " << c.channels << " O " << c.out
            << " k " << c.kernel << " s " << c.stride << " p " << c.pad << " N " << c.batch << " bits " << c.activation_bits;
      }
    }
  }
}

TEST(Bitplane, ThreadedConvEqualsOneThread) {
  const auto [w, values] = dorefa2_weight({64, 128, 3, 3});
  const at::Tensor planes = kernels::pack_bitplanes(random_codes({2, 128, 16, 16}, 2), 2);
  const int saved = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor one = kernels::bitplane_conv2d(planes, w, {1, 1, 1, 1}, {});
  at::set_num_threads(2);
  const at::Tensor two = kernels::bitplane_conv2d(planes, w, {1, 1, 1, 1}, {});
  at::set_num_threads(saved);
  EXPECT_TRUE(one.equal(two));
}

TEST(Bitplane, LinearEqualsMatmulOfTheValues) {
  for (Isa isa : kernels::supported_isas()) {
    IsaScope scope(isa);
    for (int64_t channels : {1, 63, 64, 65, 129}) {
      for (int64_t out : {1, 7, 8, 9, 33}) {
        const auto [w, values] = ternary_weight({out, channels});
        const at::Tensor a = random_codes({5, channels}, 2);
        const at::Tensor got = kernels::bitplane_linear(kernels::pack_bitplanes(a, 2), w, {});
        const at::Tensor expected = at::matmul(a.to(at::kDouble), values.to(at::kDouble).t());
        EXPECT_TRUE(test::all_close(got, expected, 0, 0)) << kernels::isa_name(isa) << " C " << channels << " O " << out;
      }
    }
  }
}

TEST(Bitplane, BadInputIsNamed) {
  const auto [w, values] = ternary_weight({4, 70, 3, 3});
  const at::Tensor planes = kernels::pack_bitplanes(random_codes({1, 70, 5, 5}, 2), 2);
  EXPECT_THROW(kernels::bitplane_conv2d(planes.select(0, 0), w, {}, {}), Error);  // rank 4: no plane axis
  EXPECT_THROW(kernels::bitplane_conv2d(kernels::pack_bitplanes(random_codes({1, 200, 5, 5}, 2), 2), w, {}, {}), Error);
  kernels::BinaryEpilogue threshold;
  threshold.threshold = at::zeros({4});
  threshold.direction = at::ones({4});
  EXPECT_THROW(kernels::bitplane_conv2d(planes, w, {}, threshold), Error);
  EXPECT_THROW(kernels::bitplane_linear(kernels::pack_bitplanes(random_codes({1, 70}, 2), 2), w, {}), Error);  // a conv weight
  EXPECT_THROW(kernels::pack_bitplane_weight({at::ones({4, 3}), at::ones({4, 4})}, {1, 1}, 0), Error);
  EXPECT_THROW(kernels::pack_bitplane_weight({at::ones({4, 3})}, {1, 1}, 0), Error);
  EXPECT_THROW(kernels::pack_bitplane_weight(std::vector<at::Tensor>(9, at::ones({4, 3})), std::vector<double>(9, 1.0), 0),
               Error);  // 9 planes: DoReFa weights have at most 8
}

}  // namespace
}  // namespace whittle
