// The CUDA bitpacked kernels (kernels/kernels_cuda.cu) against the CPU kernels, exactly.
//
// CudaKernelBodies runs on any machine: it executes, on the host, what every thread of each CUDA
// kernel computes (the index map and the per-thread body of kernels/cuda_bodies.h, the same code
// nvcc compiles for the device) over the edge sizes of kernels_test.cpp, and compares the result
// with the CPU kernels bit for bit. KernelsCuda runs the kernels on a GPU (skipped without one) and
// compares them with the CPU kernels the same way.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/binary_conv.h"
#include "kernels/bitpack.h"
#include "kernels/bitplane.h"
#include "kernels/cuda_bodies.h"
#include "kernels/cuda_ops.h"

namespace whittle {
namespace {

namespace body = kernels::cuda_body;

uint64_t* words(at::Tensor& t) { return reinterpret_cast<uint64_t*>(t.data_ptr<int64_t>()); }
const uint64_t* words(const at::Tensor& t) { return reinterpret_cast<const uint64_t*>(t.data_ptr<int64_t>()); }

// ±1-valued floats with exact zeros, −0, and (where `nan`) NaNs planted: sign(0) = +1, NaN → −1.
at::Tensor signs_with_specials(at::IntArrayRef shape, bool nan = true) {
  at::Tensor x = at::randn(shape);
  x = at::where(at::rand(shape) < 0.1, at::zeros_like(x), x);
  x = at::where(at::rand(shape) < 0.05, -at::zeros_like(x), x);
  if (nan) x = at::where(at::rand(shape) < 0.03, at::full_like(x, std::numeric_limits<float>::quiet_NaN()), x);
  return x;
}

at::Tensor random_codes(at::IntArrayRef shape, int64_t bits) {
  return at::randint(0, int64_t{1} << bits, shape, at::kLong).to(at::kFloat);
}

// ---- the CUDA kernels' grids, thread by thread, on the host (kernels_cuda.cu's loops) ----

at::Tensor emulate_pack_signs(const at::Tensor& x) {
  const at::Tensor src = x.to(at::kFloat).contiguous();
  const int64_t N = x.size(0), C = x.size(1), HW = x.dim() == 4 ? x.size(2) * x.size(3) : 1;
  at::Tensor out = at::empty_like(kernels::pack_signs_reference(x));
  const int64_t total = N * HW * kernels::words_for(C);
  for (int64_t i = 0; i < total; ++i) {
    const body::PackIndex at = body::pack_index(C, HW, i);
    words(out)[i] = body::pack_sign_word(src.data_ptr<float>(), C, HW, at.n, at.p, at.k);
  }
  return out;
}

// Bit-planes of codes, and whether every code was in range.
std::pair<at::Tensor, bool> emulate_pack_bitplanes(const at::Tensor& codes, int bits) {
  const at::Tensor src = codes.to(at::kFloat).contiguous();
  const int64_t N = codes.size(0), C = codes.size(1), HW = codes.dim() == 4 ? codes.size(2) * codes.size(3) : 1;
  std::vector<int64_t> shape{bits, N};
  if (codes.dim() == 4) shape.insert(shape.end(), {codes.size(2), codes.size(3)});
  shape.push_back(kernels::words_for(C));
  at::Tensor out = at::empty(shape, at::kLong);
  const int64_t total = N * HW * kernels::words_for(C);
  bool ok = true;
  for (int64_t i = 0; i < total; ++i) {
    const body::PackIndex at = body::pack_index(C, HW, i);
    uint64_t w[8];
    ok = body::pack_bitplane_words(src.data_ptr<float>(), C, HW, at.n, at.p, at.k, bits, w) && ok;
    for (int j = 0; j < bits; ++j) words(out)[j * total + i] = w[j];
  }
  return {out, ok};
}

at::Tensor emulate_max_pool(const at::Tensor& packed, const kernels::SignPool2dOptions& o, int64_t Ho, int64_t Wo) {
  const body::PoolShape s = body::pool_shape(packed.sizes().data(), Ho, Wo, o);
  at::Tensor out = at::empty({s.N, Ho, Wo, s.Cw}, at::kLong);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const body::WordIndex at = body::word_index(Ho, Wo, s.Cw, i);
    words(out)[i] = body::pool_sign_word(words(packed), s, at.n, at.h, at.w, at.k);
  }
  return out;
}

struct EmulatedEpilogue {
  at::Tensor scale, bias, threshold, direction;  // float [O]; threshold/direction undefined: float output
};

// A binary convolution: int32 dots (no epilogue), floats, or packed threshold words.
at::Tensor emulate_binary_conv(const at::Tensor& x, const kernels::PackedBinaryWeight& w,
                               const kernels::BinaryConv2dOptions& opt, const EmulatedEpilogue* e) {
  const int64_t N = x.size(0), H = x.size(1), W = x.size(2);
  const int64_t Ho = kernels::conv_output_size(H, w.kernel_h, opt.stride_h, opt.pad_h);
  const int64_t Wo = kernels::conv_output_size(W, w.kernel_w, opt.stride_w, opt.pad_w);
  const body::ConvShape s = kernels::detail::conv_shape(N, H, W, w, opt, Ho, Wo);
  if (e && e->threshold.defined()) {
    const int64_t Ow = kernels::words_for(s.O);
    at::Tensor out = at::empty({N, Ho, Wo, Ow}, at::kLong);
    for (int64_t i = 0; i < out.numel(); ++i) {
      const body::WordIndex at = body::word_index(Ho, Wo, Ow, i);
      words(out)[i] = body::binary_threshold_word(words(x), words(w.words), s, e->scale.data_ptr<float>(),
                                                  e->bias.data_ptr<float>(), e->threshold.data_ptr<float>(),
                                                  e->direction.data_ptr<float>(), at.n, at.h, at.w, at.k);
    }
    return out;
  }
  at::Tensor out = at::empty({N, s.O, Ho, Wo}, e ? at::kFloat : at::kInt);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const body::ConvIndex at = body::conv_index(s, i);
    const int32_t dot = body::binary_dot(words(x), words(w.words), s, at.n, at.o, at.oh, at.ow);
    if (e) out.data_ptr<float>()[i] = body::binary_value(dot, e->scale.data_ptr<float>(), e->bias.data_ptr<float>(), at.o);
    else out.data_ptr<int32_t>()[i] = dot;
  }
  return out;
}

at::Tensor emulate_bitplane_conv(const at::Tensor& planes, const kernels::PackedBitplaneWeight& w,
                                 const kernels::BinaryConv2dOptions& opt, const at::Tensor& scale, const at::Tensor& bias) {
  const int64_t N = planes.size(1), H = planes.size(2), W = planes.size(3);
  const int64_t Ho = kernels::conv_output_size(H, w.kernel_h, opt.stride_h, opt.pad_h);
  const int64_t Wo = kernels::conv_output_size(W, w.kernel_w, opt.stride_w, opt.pad_w);
  const body::ConvShape s = kernels::detail::conv_shape(N, H, W, w.planes.front(), opt, Ho, Wo);
  body::BitplaneWeight bw;
  bw.count = static_cast<int>(w.planes.size());
  bw.offset = w.offset;
  for (int i = 0; i < bw.count; ++i) {
    bw.planes[i] = words(w.planes[static_cast<size_t>(i)].words);
    bw.coefficients[i] = w.coefficients[static_cast<size_t>(i)];
  }
  at::Tensor out = at::empty({N, s.O, Ho, Wo}, at::kFloat);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const body::ConvIndex at = body::conv_index(s, i);
    out.data_ptr<float>()[i] = body::bitplane_value(words(planes), planes.size(0), bw, s, scale.data_ptr<float>(),
                                                    bias.data_ptr<float>(), at.n, at.o, at.oh, at.ow);
  }
  return out;
}

// DoReFa 2-bit weights 2c/3 − 1 as two planes (coefficients 2/3, 4/3, offset −1).
kernels::PackedBitplaneWeight dorefa2_weight(at::IntArrayRef shape) {
  const at::Tensor c = at::randint(0, 4, shape, at::kLong);
  return kernels::pack_bitplane_weight({c.bitwise_and(1).to(at::kFloat), c.bitwise_right_shift(1).to(at::kFloat)},
                                       {2.0 / 3, 4.0 / 3}, -1.0);
}

// TWN ternary weights as planes w⁺, w⁻ (coefficients +1, −1).
kernels::PackedBitplaneWeight ternary_weight(at::IntArrayRef shape) {
  const at::Tensor code = at::randint(0, 3, shape, at::kLong);
  return kernels::pack_bitplane_weight({code.eq(2).to(at::kFloat), code.eq(0).to(at::kFloat)}, {1.0, -1.0}, 0.0);
}

const std::vector<int64_t> kChannelEdges = {1, 63, 64, 65, 127, 128, 129};

TEST(CudaKernelBodies, PackSignsEqualsTheCpuKernel) {
  at::manual_seed(0);
  for (int64_t c : kChannelEdges) {
    SCOPED_TRACE("C = " + std::to_string(c));
    const at::Tensor x = signs_with_specials({3, c, 4, 5});
    EXPECT_TRUE(at::equal(emulate_pack_signs(x), kernels::pack_signs(x)));
    const at::Tensor m = signs_with_specials({2, c});
    EXPECT_TRUE(at::equal(emulate_pack_signs(m), kernels::pack_signs(m)));
  }
}

TEST(CudaKernelBodies, PackBitplanesEqualsTheCpuKernelAndFlagsBadCodes) {
  at::manual_seed(1);
  for (int64_t c : kChannelEdges)
    for (int bits : {1, 2, 3, 8}) {
      SCOPED_TRACE("C = " + std::to_string(c) + " bits = " + std::to_string(bits));
      const at::Tensor codes = random_codes({2, c, 3, 4}, bits);
      const auto [planes, ok] = emulate_pack_bitplanes(codes, bits);
      EXPECT_TRUE(ok);
      EXPECT_TRUE(at::equal(planes, kernels::pack_bitplanes(codes, bits)));
      const at::Tensor matrix = random_codes({3, c}, bits);
      EXPECT_TRUE(at::equal(emulate_pack_bitplanes(matrix, bits).first, kernels::pack_bitplanes(matrix, bits)));
    }
  at::Tensor codes = random_codes({1, 70, 2, 2}, 2);
  for (float bad : {4.0f, -1.0f, 0.5f, std::numeric_limits<float>::quiet_NaN()}) {
    at::Tensor b = codes.clone();
    b[0][69][1][1] = bad;
    EXPECT_FALSE(emulate_pack_bitplanes(b, 2).second) << bad;
    EXPECT_THROW(kernels::pack_bitplanes(b, 2), Error) << bad;
  }
}

TEST(CudaKernelBodies, MaxPoolOfSignsEqualsTheCpuKernel) {
  at::manual_seed(2);
  const std::vector<kernels::SignPool2dOptions> options = {
      {2, 2, 2, 2, 0, 0, false}, {3, 3, 2, 2, 1, 1, false}, {3, 3, 2, 2, 0, 0, true}, {2, 3, 1, 2, 1, 1, true}};
  for (int64_t c : {1, 65, 129})
    for (const auto& o : options) {
      const at::Tensor packed = kernels::pack_signs(signs_with_specials({2, c, 7, 6}, false));
      const at::Tensor want = kernels::max_pool2d_signs(packed, o);
      EXPECT_TRUE(at::equal(emulate_max_pool(packed, o, want.size(1), want.size(2)), want))
          << "C " << c << " kernel " << o.kernel_h << "x" << o.kernel_w << " stride " << o.stride_h << " pad " << o.pad_h
          << " ceil " << o.ceil_mode;
    }
}

// Calls f(x, w, options) for every edge case of kernels_test.cpp's BinaryConvEdges: K input
// channels × O output channels (1, 7, 8, 9) × stride (1, 2) × padding (0, 1) × batch (1, 3), on 6×5
// maps of ±1 with a 3×3 kernel; a trace names the case.
void for_each_binary_conv_edge(
    const std::function<void(const at::Tensor&, const at::Tensor&, const kernels::BinaryConv2dOptions&)>& f) {
  for (int64_t in_channels : kChannelEdges) {
    at::manual_seed(in_channels);
    for (int64_t out_channels : {1, 7, 8, 9})
      for (int64_t stride : {1, 2})
        for (int64_t pad : {0, 1})
          for (int64_t batch : {1, 3}) {
            SCOPED_TRACE("C=" + std::to_string(in_channels) + " O=" + std::to_string(out_channels) + " stride=" +
                         std::to_string(stride) + " pad=" + std::to_string(pad) + " N=" + std::to_string(batch));
            const at::Tensor x = signs_with_specials({batch, in_channels, 6, 5}, false);
            const at::Tensor w = signs_with_specials({out_channels, in_channels, 3, 3}, false);
            f(x, w, kernels::BinaryConv2dOptions{stride, stride, pad, pad});
          }
  }
}

TEST(CudaKernelBodies, BinaryConvDotsEqualTheReferenceAtEveryEdge) {
  for_each_binary_conv_edge([](const at::Tensor& x, const at::Tensor& w, const kernels::BinaryConv2dOptions& opt) {
    const at::Tensor got = emulate_binary_conv(kernels::pack_signs(x), kernels::pack_binary_weight(w), opt, nullptr);
    EXPECT_TRUE(at::equal(got, kernels::binary_conv2d_reference(x, w, opt)));
  });
}

TEST(CudaKernelBodies, BinaryEpiloguesEqualTheCpuKernel) {
  at::manual_seed(3);
  const int64_t C = 70, O = 67;
  const at::Tensor x = kernels::pack_signs(signs_with_specials({2, C, 5, 5}));
  const kernels::PackedBinaryWeight w = kernels::pack_binary_weight(signs_with_specials({O, C, 3, 3}, false));
  const kernels::BinaryConv2dOptions opt{1, 1, 1, 1};
  const at::Tensor clean_bias = at::randn({O});
  EmulatedEpilogue e{at::rand({O}) + 0.5, clean_bias.clone(), {}, {}};
  // Floats: one rounded multiply, then one rounded add, on both sides: equal to the bit.
  EXPECT_TRUE(at::equal(emulate_binary_conv(x, w, opt, &e), kernels::binary_conv2d(x, w, opt, {e.scale, e.bias, {}, {}})));
  e.threshold = at::randn({O}) * 10;
  e.direction = at::where(at::rand({O}) < 0.3, -1.0, 1.0).to(at::kFloat);
  e.threshold[0] = -std::numeric_limits<float>::infinity();
  e.threshold[1] = std::numeric_limits<float>::infinity();
  e.direction[0] = e.direction[1] = 1.0;
  e.bias[2] = std::numeric_limits<float>::quiet_NaN();  // a NaN y packs as −1
  EXPECT_TRUE(at::equal(emulate_binary_conv(x, w, opt, &e),
                        kernels::binary_conv2d(x, w, opt, {e.scale, e.bias, e.threshold, e.direction})));
  // A linear layer is the 1×1 case on a 1×1 map.
  const at::Tensor xm = kernels::pack_signs(signs_with_specials({3, 130}));
  const kernels::PackedBinaryWeight wm = kernels::pack_binary_weight(signs_with_specials({O, 130}, false));
  EmulatedEpilogue lin{e.scale, clean_bias, {}, {}};
  EXPECT_TRUE(at::equal(emulate_binary_conv(xm.view({3, 1, 1, -1}), wm, {}, &lin).view({3, O}),
                        kernels::binary_linear(xm, wm, {e.scale, clean_bias, {}, {}})));
  EXPECT_TRUE(at::equal(emulate_binary_conv(xm.view({3, 1, 1, -1}), wm, {}, &e).view({3, -1}),
                        kernels::binary_linear(xm, wm, {e.scale, e.bias, e.threshold, e.direction})));
}

TEST(CudaKernelBodies, BitplaneConvEqualsTheCpuKernel) {
  at::manual_seed(4);
  struct Case {
    int64_t channels, out, kernel, stride, pad, batch, activation_bits;
  };
  const std::vector<Case> cases = {{1, 1, 3, 1, 1, 1, 2},   {63, 7, 3, 1, 1, 3, 2},  {64, 8, 3, 2, 1, 1, 2},
                                   {65, 9, 3, 1, 0, 3, 1},  {127, 8, 1, 1, 0, 2, 4}, {129, 9, 3, 2, 1, 1, 3},
                                   {128, 16, 5, 1, 2, 1, 2}};
  for (const Case& c : cases)
    for (int form = 0; form < 2; ++form) {
      const kernels::PackedBitplaneWeight w = form == 0 ? ternary_weight({c.out, c.channels, c.kernel, c.kernel})
                                                        : dorefa2_weight({c.out, c.channels, c.kernel, c.kernel});
      const at::Tensor planes = kernels::pack_bitplanes(random_codes({c.batch, c.channels, 9, 8}, c.activation_bits),
                                                        c.activation_bits);
      const at::Tensor scale = at::rand({c.out}) + 0.5, bias = at::randn({c.out});
      const kernels::BinaryConv2dOptions opt{c.stride, c.stride, c.pad, c.pad};
      kernels::BinaryEpilogue e;
      e.scale = scale;
      e.bias = bias;
      // The same int32 sums, combined in double in the same order, then one multiply and one add.
      EXPECT_TRUE(at::equal(emulate_bitplane_conv(planes, w, opt, scale, bias), kernels::bitplane_conv2d(planes, w, opt, e)))
          << (form == 0 ? "ternary" : "dorefa2") << " C " << c.channels << " O " << c.out << " k " << c.kernel;
    }
  // A linear layer: planes [P, N, Cw] as [P, N, 1, 1, Cw].
  const kernels::PackedBitplaneWeight w = dorefa2_weight({9, 129});
  const at::Tensor planes = kernels::pack_bitplanes(random_codes({4, 129}, 2), 2);
  const at::Tensor scale = at::rand({9}) + 0.5, bias = at::randn({9});
  kernels::BinaryEpilogue e;
  e.scale = scale;
  e.bias = bias;
  EXPECT_TRUE(at::equal(emulate_bitplane_conv(planes.view({2, 4, 1, 1, -1}), w, {}, scale, bias).view({4, 9}),
                        kernels::bitplane_linear(planes, w, e)));
}

// ---- on a GPU ----

class KernelsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef WHITTLE_WITH_CUDA
    // A build without WHITTLE_CUDA has no CUDA kernels of whittle's to run (CudaKernelBodies
    // above still checks their arithmetic).
    GTEST_SKIP() << "built without WHITTLE_CUDA";
#endif
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
  const at::Device gpu{at::kCUDA, 0};
};

TEST_F(KernelsCuda, PackingAndPoolingEqualTheCpu) {
  at::manual_seed(5);
  for (int64_t c : kChannelEdges) {
    SCOPED_TRACE("C = " + std::to_string(c));
    const at::Tensor x = signs_with_specials({3, c, 7, 6});
    const at::Tensor packed = kernels::pack_signs(x.to(gpu));
    ASSERT_TRUE(packed.is_cuda());
    EXPECT_TRUE(at::equal(packed.cpu(), kernels::pack_signs(x)));
    const at::Tensor m = signs_with_specials({2, c});
    EXPECT_TRUE(at::equal(kernels::pack_signs(m.to(gpu)).cpu(), kernels::pack_signs(m)));
    // Many blocks (the grid-stride loops' later rounds: GridStrideLoopsCoverEveryOutput).
    const at::Tensor big = signs_with_specials({8, c, 64, 64});
    EXPECT_TRUE(at::equal(kernels::pack_signs(big.to(gpu)).cpu(), kernels::pack_signs(big)));
    for (const kernels::SignPool2dOptions& o : {kernels::SignPool2dOptions{2, 2, 2, 2, 0, 0, false},
                                                kernels::SignPool2dOptions{3, 3, 2, 2, 1, 1, true}})
      EXPECT_TRUE(at::equal(kernels::max_pool2d_signs(packed, o).cpu(), kernels::max_pool2d_signs(packed.cpu(), o)));
    for (int bits : {1, 2, 8}) {
      const at::Tensor codes = random_codes({2, c, 5, 4}, bits);
      EXPECT_TRUE(at::equal(kernels::pack_bitplanes(codes.to(gpu), bits).cpu(), kernels::pack_bitplanes(codes, bits)));
    }
  }
  at::Tensor bad = random_codes({1, 70, 2, 2}, 2);
  bad[0][3][0][0] = 4.0f;
  EXPECT_THROW(kernels::pack_bitplanes(bad.to(gpu), 2), Error);
}

TEST_F(KernelsCuda, BinaryLayersEqualTheCpuAtEveryEdge) {
  for_each_binary_conv_edge([this](const at::Tensor& x, const at::Tensor& w, const kernels::BinaryConv2dOptions& opt) {
    const at::Tensor got =
        kernels::binary_conv2d_dot(kernels::pack_signs(x.to(gpu)), kernels::pack_binary_weight(w.to(gpu)), opt);
    EXPECT_TRUE(got.is_cuda());
    EXPECT_TRUE(at::equal(got.cpu(), kernels::binary_conv2d_reference(x, w, opt)));
  });
  at::manual_seed(6);
  const int64_t C = 256, O = 130;
  const at::Tensor x = kernels::pack_signs(signs_with_specials({2, C, 28, 28}));
  const kernels::PackedBinaryWeight w = kernels::pack_binary_weight(signs_with_specials({O, C, 3, 3}, false));
  const kernels::PackedBinaryWeight wg = w.to(gpu);
  const kernels::BinaryConv2dOptions opt{1, 1, 1, 1};
  at::Tensor scale = at::rand({O}) + 0.5, bias = at::randn({O});
  EXPECT_TRUE(at::equal(kernels::binary_conv2d(x.to(gpu), wg, opt, {scale, bias, {}, {}}).cpu(),
                        kernels::binary_conv2d(x, w, opt, {scale, bias, {}, {}})));
  at::Tensor threshold = at::randn({O}) * 10, direction = at::where(at::rand({O}) < 0.3, -1.0, 1.0).to(at::kFloat);
  threshold[0] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(at::equal(kernels::binary_conv2d(x.to(gpu), wg, opt, {scale, bias, threshold, direction}).cpu(),
                        kernels::binary_conv2d(x, w, opt, {scale, bias, threshold, direction})));
  const at::Tensor xm = kernels::pack_signs(signs_with_specials({5, 300}));
  const kernels::PackedBinaryWeight wm = kernels::pack_binary_weight(signs_with_specials({O, 300}, false));
  EXPECT_TRUE(at::equal(kernels::binary_linear_dot(xm.to(gpu), wm.to(gpu)).cpu(), kernels::binary_linear_dot(xm, wm)));
  EXPECT_TRUE(at::equal(kernels::binary_linear(xm.to(gpu), wm.to(gpu), {scale, bias, threshold, direction}).cpu(),
                        kernels::binary_linear(xm, wm, {scale, bias, threshold, direction})));
  // Input and weight on different devices: a named error, not a crash.
  EXPECT_THROW(kernels::binary_conv2d_dot(x.to(gpu), w, opt), Error);
  EXPECT_THROW(kernels::binary_conv2d_dot(x, wg, opt), Error);
}

// With the launches capped at 2 blocks of 256 threads, every kernel goes round its grid-stride
// loop many times and must still write every output once, as the CPU does.
TEST_F(KernelsCuda, GridStrideLoopsCoverEveryOutput) {
#ifdef WHITTLE_WITH_CUDA  // set_grid_limit exists where the CUDA kernels are compiled (SetUp skips elsewhere)
  struct Restore {
    unsigned previous = kernels::detail::cuda::set_grid_limit(2);
    ~Restore() { kernels::detail::cuda::set_grid_limit(previous); }
  } restore;
  at::manual_seed(8);
  const at::Tensor x = signs_with_specials({2, 70, 13, 11});
  const at::Tensor packed = kernels::pack_signs(x.to(gpu));
  EXPECT_TRUE(at::equal(packed.cpu(), kernels::pack_signs(x)));
  const kernels::SignPool2dOptions pool{2, 2, 2, 2, 0, 0, true};
  EXPECT_TRUE(at::equal(kernels::max_pool2d_signs(packed, pool).cpu(), kernels::max_pool2d_signs(packed.cpu(), pool)));
  const kernels::PackedBinaryWeight w = kernels::pack_binary_weight(signs_with_specials({67, 70, 3, 3}, false));
  const kernels::BinaryConv2dOptions opt{1, 1, 1, 1};
  EXPECT_TRUE(at::equal(kernels::binary_conv2d_dot(packed, w.to(gpu), opt).cpu(),
                        kernels::binary_conv2d_dot(packed.cpu(), w, opt)));
  at::Tensor threshold = at::randn({67}), direction = at::ones({67});
  EXPECT_TRUE(at::equal(kernels::binary_conv2d(packed, w.to(gpu), opt, {{}, {}, threshold, direction}).cpu(),
                        kernels::binary_conv2d(packed.cpu(), w, opt, {{}, {}, threshold, direction})));
  const at::Tensor codes = random_codes({2, 70, 13, 11}, 2);
  const at::Tensor planes = kernels::pack_bitplanes(codes.to(gpu), 2);
  EXPECT_TRUE(at::equal(planes.cpu(), kernels::pack_bitplanes(codes, 2)));
  const kernels::PackedBitplaneWeight bw = dorefa2_weight({9, 70, 3, 3});
  EXPECT_TRUE(at::equal(kernels::bitplane_conv2d(planes, bw.to(gpu), opt, {}).cpu(),
                        kernels::bitplane_conv2d(planes.cpu(), bw, opt, {})));
#endif
}

TEST_F(KernelsCuda, BitplaneLayersEqualTheCpu) {
  at::manual_seed(7);
  for (int64_t c : {1, 65, 128, 129})
    for (int form = 0; form < 2; ++form) {
      const kernels::PackedBitplaneWeight w = form == 0 ? ternary_weight({9, c, 3, 3}) : dorefa2_weight({9, c, 3, 3});
      const at::Tensor planes = kernels::pack_bitplanes(random_codes({3, c, 9, 8}, 2), 2);
      kernels::BinaryEpilogue e;
      e.scale = at::rand({9}) + 0.5;
      e.bias = at::randn({9});
      for (int64_t stride : {1, 2})
        EXPECT_TRUE(at::equal(kernels::bitplane_conv2d(planes.to(gpu), w.to(gpu), {stride, stride, 1, 1}, e).cpu(),
                              kernels::bitplane_conv2d(planes, w, {stride, stride, 1, 1}, e)))
            << "C " << c << (form == 0 ? " ternary" : " dorefa2") << " stride " << stride;
      const kernels::PackedBitplaneWeight wl = dorefa2_weight({9, c});
      const at::Tensor pl = kernels::pack_bitplanes(random_codes({4, c}, 2), 2);
      EXPECT_TRUE(at::equal(kernels::bitplane_linear(pl.to(gpu), wl.to(gpu), e).cpu(), kernels::bitplane_linear(pl, wl, e)));
    }
}

}  // namespace
}  // namespace whittle
