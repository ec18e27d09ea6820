// The fused CPU quantizer kernels (quantize/fused_quantizers.h) against the ATen-op forms they
// replace (set_fused_quantizers(false)): every quantizer of quantize/quantizers.h, forward values and
// straight-through gradients, on random tensors of 1, 31, 32, 33 and 1,000,003 elements (the edges
// of the 8-element mask bytes and of the vector widths, and a size that splits unevenly over
// threads), per tensor and per channel (axis 0 and 1), with NaN, ±inf, ±0 and the exact clip
// boundaries planted. "Equal" is value equality: NaN equals NaN, +0 equals −0 (documented in
// fused_quantizers.h), nothing else may differ by a single bit.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "quantize/fused_quantizers.h"
#include "quantize/quantizers.h"
#include "support.h"

namespace whittle::test {
namespace {

namespace q = whittle::quantize;

// Value equality as described above; on failure names the first differing element.
::testing::AssertionResult same_values(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream os;
    os << "shape " << actual.sizes() << " vs " << expected.sizes();
    return ::testing::AssertionFailure() << os.str();
  }
  if (actual.scalar_type() != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type() << " vs " << expected.scalar_type();
  at::Tensor a = actual.detach().flatten(), e = expected.detach().flatten();
  at::Tensor ok = (a == e) | (a.isnan() & e.isnan());
  if (ok.all().item<bool>()) return ::testing::AssertionSuccess();
  const int64_t i = (~ok).nonzero()[0][0].item<int64_t>();
  std::ostringstream os;
  os.precision(9);
  os << (~ok).sum().item<int64_t>() << " of " << a.numel() << " elements differ; first at flat index " << i
     << ": fused " << a[i].item<double>() << ", ATen " << e[i].item<double>();
  return ::testing::AssertionFailure() << os.str();
}

// Turns the fused kernels on or off for one scope, restoring the previous setting.
class FusedSetting {
 public:
  explicit FusedSetting(bool on) : previous_(q::fused_quantizers_enabled()) { q::set_fused_quantizers(on); }
  ~FusedSetting() { q::set_fused_quantizers(previous_); }
  FusedSetting(const FusedSetting&) = delete;
  FusedSetting& operator=(const FusedSetting&) = delete;

 private:
  bool previous_;
};

struct Result {
  at::Tensor output, grad;
};

// f(x) with x requiring grad, backward with upstream `upstream`; fused on or off.
Result run(const at::Tensor& x, const at::Tensor& upstream, bool fused, const std::function<at::Tensor(const at::Tensor&)>& f) {
  FusedSetting setting(fused);
  at::Tensor leaf = x.detach().clone().set_requires_grad(true);
  at::Tensor y = f(leaf);
  y.backward(upstream);
  return {y.detach(), leaf.grad()};
}

// Forward and backward with and without the fused kernels, also forward without grad.
void expect_fused_equals_aten(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& f) {
  at::Tensor upstream = at::randn(x.sizes()).to(x.device()) * 3;
  const Result fused = run(x, upstream, true, f);
  const Result aten = run(x, upstream, false, f);
  EXPECT_TRUE(same_values(fused.output, aten.output)) << "forward";
  ASSERT_TRUE(fused.grad.defined());
  EXPECT_TRUE(same_values(fused.grad, aten.grad)) << "backward";
  at::NoGradGuard no_grad;
  at::Tensor inference_fused, inference_aten;
  {
    FusedSetting on(true);
    inference_fused = f(x);
  }
  {
    FusedSetting off(false);
    inference_aten = f(x);
  }
  EXPECT_TRUE(same_values(inference_fused, inference_aten)) << "forward without autograd";
  EXPECT_TRUE(same_values(inference_fused, aten.output)) << "forward without autograd against with";
}

const std::vector<int64_t> kSizes = {1, 31, 32, 33, 1000003};

// Random activations of n elements: normal around 0.5 with spread 1.5 (so every clip region is
// populated), with the clip boundaries, ±0, ±inf and NaN planted at the start when there is room.
at::Tensor activations(int64_t n, double clip) {
  at::Tensor x = at::randn({n}) * 1.5 + 0.5;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {0.0f, -0.0f, static_cast<float>(clip), 1.0f, -1.0f, inf, -inf,
                                      std::numeric_limits<float>::quiet_NaN(), static_cast<float>(clip) * 0.5f,
                                      static_cast<float>(clip) / 3.0f};
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(special.size()); ++i) x[i * 3 % n] = special[i];
  return x;
}

TEST(FusedQuantizers, DoReFaActivationsEqualTheAtenForm) {
  at::manual_seed(1);
  for (int64_t n : kSizes)
    for (int64_t bits : {1, 2, 4, 8})
      for (double clip : {1.0, 2.0, 0.75}) {
        SCOPED_TRACE("n " + std::to_string(n) + ", " + std::to_string(bits) + " bits, clip " + std::to_string(clip));
        // Also as a 4-D activation map, the shape the quantizer sees in a network.
        at::Tensor x = activations(n, clip);
        expect_fused_equals_aten(x, [&](const at::Tensor& t) { return q::dorefa_activation(t, bits, clip); });
        if (n == 1000003) {
          at::Tensor map = activations(2 * 16 * 33 * 33, clip).reshape({2, 16, 33, 33});
          expect_fused_equals_aten(map, [&](const at::Tensor& t) { return q::dorefa_activation(t, bits, clip); });
        }
      }
}

// The quantizer of relu(x) (after_relu, the quantize pass's act_quant with relu = 1) equals ReLU
// then the quantizer, values and gradients, with the fused kernels and without them; zeros planted
// (ReLU's gradient at 0 is 0, the quantizer's 1).
TEST(FusedQuantizers, DoReFaAfterReluEqualsReluThenQuantizer) {
  at::manual_seed(11);
  for (const int64_t n : {1, 31, 33, 1000003}) {
    at::Tensor x = at::randn({n}) * 1.5;
    x.index_put_({at::arange(0, n, 3)}, 0.0);
    if (n > 2) x[1] = 2.0;
    for (const bool fused : {true, false}) {
      for (const double clip : {1.0, 2.0}) {
        at::Tensor upstream = at::randn({n});
        const Result folded = run(x, upstream, fused, [&](const at::Tensor& t) { return q::dorefa_activation(t, 2, clip, true); });
        const Result chain = run(x, upstream, fused, [&](const at::Tensor& t) { return q::dorefa_activation(at::relu(t), 2, clip); });
        EXPECT_TRUE(same_values(folded.output, chain.output)) << n << " fused " << fused << " clip " << clip;
        EXPECT_TRUE(same_values(folded.grad, chain.grad)) << n << " fused " << fused << " clip " << clip;
      }
    }
    expect_fused_equals_aten(x, [](const at::Tensor& t) { return q::dorefa_activation(t, 4, 2.0, true); });
  }
  // bits 32 with the ReLU folded in is the ReLU.
  at::Tensor x = at::tensor({-1.0f, 0.0f, 0.5f});
  EXPECT_TRUE(q::dorefa_activation(x, 32, 1.0, true).equal(at::relu(x)));
}

TEST(FusedQuantizers, BnnSignEqualsTheAtenForm) {
  at::manual_seed(2);
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n " + std::to_string(n));
    expect_fused_equals_aten(activations(n, 1.0), [](const at::Tensor& t) { return q::bnn_sign(t); });
  }
}

// Weights: [rows, cols] tensors (per channel along axis 0 = rows channels, axis 1 = cols channels)
// and a conv weight [33, 31, 3, 3]; ±inf planted (tanh(±inf) = ±1, the largest |tanh|).
std::vector<at::Tensor> weights(int64_t n) {
  std::vector<at::Tensor> out;
  at::Tensor flat = at::randn({n}) * 0.1;
  flat[0] = 0.0f;
  if (n > 5) {
    flat[3] = std::numeric_limits<float>::infinity();
    flat[5] = -0.0f;
  }
  out.push_back(flat.reshape({1, n}));
  out.push_back(flat.reshape({n, 1}));
  if (n > 1) {
    at::Tensor three = at::randn({3, n}) * 0.05;
    three[1][n - 1] = -std::numeric_limits<float>::infinity();
    out.push_back(three);
  }
  if (n == 33) out.push_back(at::randn({33, 31, 3, 3}) * 0.08);
  return out;
}

struct WeightCase {
  q::Granularity granularity;
  int64_t axis;
  const char* name;
};
const WeightCase kWeightCases[] = {{q::Granularity::kPerTensor, 0, "per tensor"},
                                   {q::Granularity::kPerChannel, 0, "per channel, axis 0"},
                                   {q::Granularity::kPerChannel, 1, "per channel, axis 1"}};

TEST(FusedQuantizers, DoReFaWeightsEqualTheAtenForm) {
  at::manual_seed(3);
  for (int64_t n : kSizes)
    for (const at::Tensor& w : weights(n))
      for (const WeightCase& c : kWeightCases)
        for (int64_t bits : {2, 3, 4, 8}) {
          std::ostringstream trace;
          trace << "shape " << w.sizes() << ", " << c.name << ", " << bits << " bits";
          SCOPED_TRACE(trace.str());
          expect_fused_equals_aten(w, [&](const at::Tensor& t) { return q::dorefa_weight(t, bits, c.granularity, c.axis); });
        }
}

TEST(FusedQuantizers, TernaryWeightsEqualTheAtenForm) {
  at::manual_seed(4);
  for (int64_t n : kSizes)
    for (const at::Tensor& w : weights(n))
      for (const WeightCase& c : kWeightCases) {
        std::ostringstream trace;
        trace << "shape " << w.sizes() << ", " << c.name;
        SCOPED_TRACE(trace.str());
        // TWN of an infinite weight is not defined (Δ = 0.7·mean|w| = inf): finite weights only.
        at::Tensor finite = at::nan_to_num(w, 0.0, 0.0, 0.0);
        expect_fused_equals_aten(finite, [&](const at::Tensor& t) { return q::twn_weight(t, c.granularity, c.axis); });
      }
}

TEST(FusedQuantizers, XnorWeightsEqualTheAtenForm) {
  at::manual_seed(5);
  for (int64_t n : {31, 33})
    for (const at::Tensor& w : weights(n))
      for (const WeightCase& c : kWeightCases) {
        at::Tensor finite = at::nan_to_num(w, 0.0, 0.0, 0.0);
        expect_fused_equals_aten(finite, [&](const at::Tensor& t) { return q::xnor_weight(t, false, c.granularity, c.axis); });
      }
}

// The kernels themselves, on hand-worked values.
TEST(FusedQuantizers, MaskBitsAreLeastSignificantFirstAndPaddedWithZero) {
  // 2 bits, clip 1: levels 0, 1/3, 2/3, 1. Elements 0..9; inside [0, 1]: indices 0, 2, 3, 5, 8, 9.
  at::Tensor x = at::tensor({0.0f, -0.5f, 0.3f, 1.0f, 1.5f, 0.6f, -1.0f, 2.0f, 0.5f, 0.9f});
  q::fused::MaskedOutput r = q::fused::dorefa_activation(x, 2, 1.0, true);
  ASSERT_EQ(r.mask.numel(), 2);
  EXPECT_EQ(r.mask.scalar_type(), at::kByte);
  // byte 0: bits 0, 2, 3, 5 = 1 + 4 + 8 + 32 = 45; byte 1: bits 0, 1 (elements 8, 9) = 3.
  EXPECT_EQ(r.mask[0].item<int64_t>(), 45);
  EXPECT_EQ(r.mask[1].item<int64_t>(), 3);
  // round(0.3·3) = 1 → 1/3; round(0.6·3) = round(1.8) = 2 → 2/3; round(0.5·3) = round(1.5) = 2 (half to even).
  const float third = 1.0f / 3.0f;
  at::Tensor expected = at::tensor({0.0f, 0.0f, third, 1.0f, 1.0f, 2 * third, 0.0f, 1.0f, 2 * third, 1.0f});
  EXPECT_TRUE(all_close(r.output, expected, 1e-7, 0));
  at::Tensor g = q::fused::mask_multiply(at::arange(1, 11, at::kFloat), r.mask);
  EXPECT_TRUE(same_values(g, at::tensor({1.0f, 0.0f, 3.0f, 4.0f, 0.0f, 6.0f, 0.0f, 0.0f, 9.0f, 10.0f})));
}

TEST(FusedQuantizers, SignMaskHoldsTheBnnGradientWindow) {
  at::Tensor x = at::tensor({-2.0f, -1.0f, -0.0f, 0.5f, 1.0f, 1.01f, std::numeric_limits<float>::quiet_NaN()});
  q::fused::MaskedOutput r = q::fused::sign(x, true);
  EXPECT_TRUE(same_values(r.output, at::tensor({-1.0f, -1.0f, 1.0f, 1.0f, 1.0f, 1.0f, -1.0f})));
  ASSERT_EQ(r.mask.numel(), 1);
  EXPECT_EQ(r.mask[0].item<int64_t>(), 2 + 4 + 8 + 16);  // |x| ≤ 1 at indices 1..4
}

TEST(FusedQuantizers, AbsMaxPerChannelAlongEitherAxis) {
  at::Tensor t = at::tensor({1.0f, -5.0f, 2.0f, -3.0f, 0.5f, 4.0f}).reshape({2, 3});
  EXPECT_TRUE(same_values(q::fused::abs_max(t, true, 0), at::tensor({5.0f, 4.0f})));
  EXPECT_TRUE(same_values(q::fused::abs_max(t, true, 1), at::tensor({3.0f, 5.0f, 4.0f})));
  EXPECT_TRUE(same_values(q::fused::abs_max(t, false, 0), at::tensor({5.0f})));
}

TEST(FusedQuantizers, RejectWhatTheyDoNotTake) {
  EXPECT_FALSE(q::fused::fused_supported(at::ones({4}, at::kDouble)));
  EXPECT_FALSE(q::fused::fused_supported(at::ones({4, 4}).t()));
  EXPECT_TRUE(q::fused::fused_supported(at::ones({4, 4})));
  EXPECT_THROW(q::fused::dorefa_activation(at::ones({4}, at::kDouble), 2, 1.0, true), Error);
  EXPECT_THROW(q::fused::dorefa_activation(at::ones({4}), 0, 1.0, true), Error);
  EXPECT_THROW(q::fused::dorefa_activation(at::ones({4}), 2, -1.0, true), Error);
  EXPECT_THROW(q::fused::mask_multiply(at::ones({9}), at::zeros({1}, at::kByte)), Error);
  EXPECT_THROW(q::fused::abs_max(at::ones({2, 3}), true, 2), Error);
}

// A non-contiguous or double input takes the ATen form, with the same values.
TEST(FusedQuantizers, OtherLayoutsFallBackToTheAtenForm) {
  at::manual_seed(6);
  at::Tensor x = at::randn({33, 31}).t();
  expect_fused_equals_aten(x, [](const at::Tensor& t) { return q::dorefa_activation(t, 4, 2.0); });
  at::Tensor d = at::randn({65}, at::kDouble);
  FusedSetting on(true);
  at::Tensor y = q::dorefa_activation(d, 4, 2.0);
  EXPECT_EQ(y.scalar_type(), at::kDouble);
}

// ---- CUDA: the same comparisons on the GPU (FusedQuantizersCuda), against the ATen-op forms on the
// GPU: ATen's CUDA division by a scalar multiplies by its float reciprocal, which the CUDA kernels
// follow (quantize/quantize_cuda.cu), so CPU and CUDA values may differ in the last bit where the
// reciprocal is inexact; the masks, which are comparisons, equal the CPU's bit for bit. Skipped
// without a CUDA device or in a build without WHITTLE_CUDA.

class FusedQuantizersCuda : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef WHITTLE_WITH_CUDA
    // A build without whittle's CUDA kernels (WHITTLE_CUDA=OFF, e.g. the sanitizer build) on a
    // machine with a GPU: CUDA tensors take the ATen-op forms, there is nothing of ours to compare.
    GTEST_SKIP() << "built without WHITTLE_CUDA";
#endif
    WHITTLE_REQUIRE_CUDA();
    previous_ = q::fused_quantizers_cuda_enabled();
    saved_ = true;
    q::set_fused_quantizers_cuda(true);
  }
  // Runs after a skip in SetUp too: restores only what SetUp changed.
  void TearDown() override {
    if (saved_) q::set_fused_quantizers_cuda(previous_);
  }

 private:
  bool previous_ = false, saved_ = false;
};

at::Tensor on_gpu(const at::Tensor& t) { return t.to(at::kCUDA); }

TEST_F(FusedQuantizersCuda, DoReFaActivationsEqualTheAtenForm) {
  at::manual_seed(1);
  for (int64_t n : kSizes)
    for (int64_t bits : {1, 2, 4, 8})
      for (double clip : {1.0, 2.0, 0.75}) {
        SCOPED_TRACE("n " + std::to_string(n) + ", " + std::to_string(bits) + " bits, clip " + std::to_string(clip));
        at::Tensor x = on_gpu(activations(n, clip));
        ASSERT_TRUE(q::fused::fused_supported(x));
        expect_fused_equals_aten(x, [&](const at::Tensor& t) { return q::dorefa_activation(t, bits, clip); });
        expect_fused_equals_aten(x, [&](const at::Tensor& t) { return q::dorefa_activation(t, bits, clip, true); });
        if (n == 1000003) {
          at::Tensor map = on_gpu(activations(2 * 16 * 33 * 33, clip).reshape({2, 16, 33, 33}));
          expect_fused_equals_aten(map, [&](const at::Tensor& t) { return q::dorefa_activation(t, bits, clip); });
        }
      }
}

TEST_F(FusedQuantizersCuda, BnnSignEqualsTheAtenForm) {
  at::manual_seed(2);
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n " + std::to_string(n));
    expect_fused_equals_aten(on_gpu(activations(n, 1.0)), [](const at::Tensor& t) { return q::bnn_sign(t); });
  }
}

TEST_F(FusedQuantizersCuda, WeightsEqualTheAtenForm) {
  at::manual_seed(3);
  for (int64_t n : kSizes)
    for (const at::Tensor& cpu : weights(n))
      for (const WeightCase& c : kWeightCases) {
        std::ostringstream trace;
        trace << "shape " << cpu.sizes() << ", " << c.name;
        SCOPED_TRACE(trace.str());
        const at::Tensor w = on_gpu(cpu);
        ASSERT_TRUE(q::fused::fused_supported(w));
        for (int64_t bits : {2, 3, 4, 8})
          expect_fused_equals_aten(w, [&](const at::Tensor& t) { return q::dorefa_weight(t, bits, c.granularity, c.axis); });
        const at::Tensor finite = at::nan_to_num(w, 0.0, 0.0, 0.0);
        expect_fused_equals_aten(finite, [&](const at::Tensor& t) { return q::twn_weight(t, c.granularity, c.axis); });
        expect_fused_equals_aten(finite, [&](const at::Tensor& t) { return q::xnor_weight(t, false, c.granularity, c.axis); });
        // The kernels called directly (the comparisons above pass through the quantizers' switch),
        // against the encode/decode ATen forms on the GPU.
        const bool per_channel = c.granularity == q::Granularity::kPerChannel;
        const at::Tensor t = at::tanh(w);
        const at::Tensor m = q::fused::abs_max(t, per_channel, c.axis).clamp_min(1e-12);
        ASSERT_TRUE(m.is_cuda());
        for (int64_t bits : {2, 4}) {
          const q::EncodedWeight e = q::dorefa_encode(w, bits, c.granularity, c.axis);
          EXPECT_TRUE(same_values(q::fused::dorefa_weight_values(t, m, bits, c.axis),
                                  q::decode_weight(e.codes, e.scale, e.encoding, e.bits, e.axis, at::kFloat)))
              << bits << " bits, direct";
        }
        const at::Tensor g = at::randn(w.sizes()).to(w.device());
        std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
        shape[static_cast<size_t>(c.axis)] = m.numel();
        EXPECT_TRUE(same_values(q::fused::dorefa_weight_grad(g, t, m, c.axis), g * (1 - t * t) / m.reshape(shape)))
            << "DoReFa gradient, direct";
        const q::TwnThreshold th = q::twn_threshold(finite, c.granularity, c.axis);
        const q::EncodedWeight te = q::twn_encode(finite, c.granularity, c.axis);
        EXPECT_TRUE(same_values(q::fused::ternary_values(finite, th.delta, th.alpha, c.axis),
                                q::decode_weight(te.codes, te.scale, te.encoding, te.bits, te.axis, at::kFloat)))
            << "TWN, direct";
      }
}

TEST_F(FusedQuantizersCuda, MasksEqualTheCpuMasksBitForBit) {
  at::manual_seed(7);
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n " + std::to_string(n));
    const at::Tensor x = activations(n, 2.0);
    for (const bool after_relu : {false, true}) {
      const q::fused::MaskedOutput cpu = q::fused::dorefa_activation(x, 2, 2.0, true, after_relu);
      const q::fused::MaskedOutput gpu = q::fused::dorefa_activation(on_gpu(x), 2, 2.0, true, after_relu);
      ASSERT_TRUE(gpu.mask.is_cuda());
      EXPECT_TRUE(at::equal(gpu.mask.cpu(), cpu.mask)) << "DoReFa, after_relu " << after_relu;
    }
    const q::fused::MaskedOutput cpu = q::fused::sign(x, true);
    const q::fused::MaskedOutput gpu = q::fused::sign(on_gpu(x), true);
    EXPECT_TRUE(at::equal(gpu.mask.cpu(), cpu.mask)) << "sign";
    EXPECT_TRUE(same_values(gpu.output.cpu(), cpu.output)) << "sign values";
    const at::Tensor g = at::randn({n});
    EXPECT_TRUE(same_values(q::fused::mask_multiply(on_gpu(g), gpu.mask).cpu(), q::fused::mask_multiply(g, cpu.mask)));
  }
  // The hand-worked mask of FusedQuantizers.MaskBitsAreLeastSignificantFirstAndPaddedWithZero.
  at::Tensor x = on_gpu(at::tensor({0.0f, -0.5f, 0.3f, 1.0f, 1.5f, 0.6f, -1.0f, 2.0f, 0.5f, 0.9f}));
  const q::fused::MaskedOutput r = q::fused::dorefa_activation(x, 2, 1.0, true);
  EXPECT_EQ(r.mask[0].item<int64_t>(), 45);
  EXPECT_EQ(r.mask[1].item<int64_t>(), 3);
}

TEST(FusedQuantizers, CudaKernelsAreOffUntilAsked) {
  // Off by default (until checked on a GPU), so CUDA tensors take the ATen-op forms; the switch holds.
  if (std::getenv("WHITTLE_FUSED_QUANTIZERS_CUDA") == nullptr) EXPECT_FALSE(q::fused_quantizers_cuda_enabled());
  const bool previous = q::fused_quantizers_cuda_enabled();
  q::set_fused_quantizers_cuda(true);
  EXPECT_TRUE(q::fused_quantizers_cuda_enabled());
  q::set_fused_quantizers_cuda(previous);
  EXPECT_EQ(q::fused_quantizers_cuda_enabled(), previous);
}

}  // namespace
}  // namespace whittle::test
