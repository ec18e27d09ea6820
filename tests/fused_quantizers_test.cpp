// The fused CPU quantizer kernels (quantize/fused_quantizers.h) against the ATen-op forms they
// replace (set_fused_quantizers(false)): every quantizer of quantize/quantizers.h, forward values and
// straight-through gradients, on random tensors of 1, 31, 32, 33 and 1,000,003 elements (the edges
// of the 8-element mask bytes and of the vector widths, and a size that splits unevenly over
// threads), per tensor and per channel (axis 0 and 1), with NaN, ±inf, ±0 and the exact clip
// boundaries planted. "Equal" is value equality: NaN equals NaN, +0 equals −0 (documented in
// fused_quantizers.h), nothing else may differ by a single bit.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "graph/graph.h"
#include "quantize/fused_quantizers.h"
#include "quantize/lsq.h"
#include "quantize/quantize.h"
#include "quantize/quantize_cuda_bodies.h"
#include "quantize/quantizers.h"
#ifdef WHITTLE_WITH_CUDA
#include "quantize/quantize_cuda.h"
#endif
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

// ---- The CUDA kernels' per-element bodies (quantize/quantize_cuda_bodies.h), run on the host over
// every element, on any machine (CudaQuantizerBodies). The kernels of quantize/quantize_cuda.cu are
// grid-stride loops over those bodies; here the same loops (core/cuda_grid.h's first_element,
// warp_first_element, grid_stride; the bodies' masked_lane, store_warp_mask) run over a few grids, with the
// warp ballot emulated as the OR of the lanes' bits, checking that each element is written once.
// What stays untested on the host is the launch itself and __ballot_sync (the GPU tests below).
// The values must be those of the ATen-op forms as ATen computes them on CUDA (division by a
// scalar as a multiplication by its float reciprocal), written below as CPU ATen ops, bit for bit,
// and close to the CPU kernels'; masks, signs, gradients and ternary values bit for bit the CPU
// kernels'. This file is compiled with -ffp-contract=off so the host bodies round each operation
// as the device does.

namespace body = whittle::quantize::cuda_body;

struct Grid {
  int64_t blocks, threads;  // threads: a multiple of 32, as the launches' kThreadsPerBlock
};

// The grids each emulation runs over: one warp (every loop takes many trips), three blocks of 64,
// and the launch's own (kThreadsPerBlock threads, a block per kThreadsPerBlock elements).
std::vector<Grid> grids_for(int64_t n) {
  const int64_t t = whittle::cuda_grid::kThreadsPerBlock;
  return {{1, 32}, {3, 64}, {(n + t - 1) / t, t}};
}

// masked_quantizer_kernel on the host: per warp, its lanes' masked_lane, the ballot as the OR of
// their bits, store_warp_mask. Returns the output and the mask; every output element must be
// written once (checked); outputs and mask bytes start as 7.0 and 0xFF so what is not written shows.
template <class Op>
std::pair<at::Tensor, at::Tensor> emulate_masked(const at::Tensor& x_in, Op op, Grid g) {
  const at::Tensor x = x_in.contiguous();
  const int64_t n = x.numel();
  at::Tensor y = at::full({n}, 7.0f), mask = at::full({(n + 7) / 8}, 255, at::kByte);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  std::vector<int> visits(static_cast<size_t>(n), 0);
  const int64_t stride = whittle::cuda_grid::grid_stride(g.blocks, g.threads);
  for (int64_t block = 0; block < g.blocks; ++block)
    for (int64_t warp = 0; warp < g.threads / 32; ++warp) {
      // Every lane of a warp (thread warp·32 + lane, lane = thread & 31) starts at the same element.
      const int64_t first = whittle::cuda_grid::warp_first_element(block, g.threads, warp * 32);
      for (int64_t lane = 1; lane < 32; ++lane)
        if (whittle::cuda_grid::warp_first_element(block, g.threads, warp * 32 + lane) != first) {
          ADD_FAILURE() << "lane " << lane << " of warp " << warp << " starts elsewhere";
          return {y, mask};
        }
      for (int64_t base = first; base < n; base += stride) {
        uint32_t bits = 0;
        for (int64_t lane = 0; lane < 32; ++lane) {
          if (base + lane < n) ++visits[static_cast<size_t>(base + lane)];
          bits |= static_cast<uint32_t>(body::masked_lane(xp, yp, n, base + lane, op)) << lane;
        }
        for (int64_t lane = 0; lane < 32; ++lane) body::store_warp_mask(mask.data_ptr<uint8_t>(), lane, base, n, bits);
      }
    }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(visits[static_cast<size_t>(i)], 1) << "element " << i;
  return {y.reshape(x_in.sizes()), mask};
}

// The element-wise kernels' grid-stride loop on the host: f(i) for every i < n, each once (checked).
void emulate_elementwise(int64_t n, Grid g, const std::function<void(int64_t)>& f) {
  std::vector<int> visits(static_cast<size_t>(n), 0);
  const int64_t stride = whittle::cuda_grid::grid_stride(g.blocks, g.threads);
  for (int64_t block = 0; block < g.blocks; ++block)
    for (int64_t thread = 0; thread < g.threads; ++thread)
      for (int64_t i = whittle::cuda_grid::first_element(block, g.threads, thread); i < n; i += stride) {
        f(i);
        ++visits[static_cast<size_t>(i)];
      }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(visits[static_cast<size_t>(i)], 1) << "element " << i;
}

// Every element within `last_bits` of the CPU kernel's (NaN matching NaN), except at most
// `max_jumps` of them, which may be up to `jump` apart. The CUDA form's reciprocal rounds
// differently from a true division: decoded values may differ in their last bits, and an activation
// whose x/c·n lies within an ulp of a rounding midpoint may land on the next level, c/n away (as
// ATen's own CPU and CUDA forms do).
::testing::AssertionResult close_to_cpu(const at::Tensor& actual, const at::Tensor& expected, float last_bits,
                                        float jump = 0.0f, int64_t max_jumps = 0) {
  const at::Tensor a = actual.contiguous().flatten(), e = expected.contiguous().flatten();
  const float* ap = a.data_ptr<float>();
  const float* ep = e.data_ptr<float>();
  int64_t jumps = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if ((std::isnan(ap[i]) && std::isnan(ep[i])) || std::fabs(ap[i] - ep[i]) <= last_bits) continue;
    ++jumps;
    if (!(std::fabs(ap[i] - ep[i]) <= jump))
      return ::testing::AssertionFailure() << "element " << i << ": " << ap[i] << " vs " << ep[i];
  }
  if (jumps > max_jumps)
    return ::testing::AssertionFailure() << jumps << " of " << a.numel() << " elements a level apart";
  return ::testing::AssertionSuccess();
}

// The ATen-op DoReFa activation (quantizers.cpp) as ATen evaluates it on CUDA: each division by a
// scalar a multiplication by the scalar's float reciprocal.
at::Tensor dorefa_activation_cuda_form(const at::Tensor& x, int64_t bits, float clip) {
  const auto n = static_cast<float>((int64_t{1} << bits) - 1);
  at::Tensor r = clip == 1.0f ? x.clamp(0.0, 1.0) : x.clamp(0.0, clip).mul(static_cast<double>(1.0f / clip));
  at::Tensor q = at::round(r.mul(static_cast<double>(n))).mul(static_cast<double>(1.0f / n));
  return clip == 1.0f ? q : q.mul(static_cast<double>(clip));
}

TEST(CudaQuantizerBodies, DoReFaActivationsAreTheAtenCudaFormAndTheCpuMasks) {
  at::manual_seed(21);
  for (int64_t n : kSizes)
    for (int64_t bits : {1, 2, 4, 8})
      for (float clip : {1.0f, 2.0f, 0.75f, 1.3f})
        for (bool after_relu : {false, true}) {
          SCOPED_TRACE("n " + std::to_string(n) + ", " + std::to_string(bits) + " bits, clip " + std::to_string(clip) +
                       (after_relu ? ", after ReLU" : ""));
          const at::Tensor x = activations(n, clip);
          const float levels = body::dorefa_levels(static_cast<int>(bits));
          const body::DoReFaActivationOp op = body::dorefa_activation_op(clip, static_cast<int>(bits), after_relu);
          const q::fused::MaskedOutput cpu = q::fused::dorefa_activation(x, bits, clip, true, after_relu);
          const at::Tensor expected = dorefa_activation_cuda_form(after_relu ? at::relu(x) : x, bits, clip);
          for (const Grid& g : n == 1000003 ? std::vector<Grid>{grids_for(n).back()} : grids_for(n)) {
            const std::pair<at::Tensor, at::Tensor> r = emulate_masked(x, op, g);
            EXPECT_TRUE(same_values(r.first, expected)) << "values, grid " << g.blocks << "×" << g.threads;
            EXPECT_TRUE(at::equal(r.second, cpu.mask)) << "mask, grid " << g.blocks << "×" << g.threads;
            // A few ulps of c apart; one level (c/n) apart only where the reciprocal of c is
            // inexact, for about one element in a million at 8 bits: at most 10 of 1,000,003.
            EXPECT_TRUE(close_to_cpu(r.first, cpu.output, clip * 4.8e-7f, clip / levels * 1.0001f,
                                     (clip == 1.0f || clip == 2.0f) ? 0 : (n < 1000 ? 1 : 10)))
                << "against the CPU kernel";
          }
        }
  // 8 bits, clip 1: 1/255 is not a float, and round(x·255)·(1/255) misses round(x·255)/255 by one
  // ulp for some codes; the CUDA form is the multiplication (hand-worked: code 3).
  const float code3 = 3.0f * (1.0f / 255.0f);
  EXPECT_NE(code3, 3.0f / 255.0f);
  const body::DoReFaActivationOp op8{1.0f, 1.0f, 255.0f, 1.0f / 255.0f, true, false};
  EXPECT_EQ(op8.value(3.0f / 255.0f), code3);
}

TEST(CudaQuantizerBodies, SignAndMaskMultiplyEqualTheCpuKernels) {
  at::manual_seed(22);
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n " + std::to_string(n));
    const at::Tensor x = activations(n, 1.0);
    const q::fused::MaskedOutput cpu = q::fused::sign(x, true);
    const at::Tensor g = at::randn({n});
    // x[15] = inf (planted by activations): its bit is 0, and an infinite gradient there gives
    // inf·0 = NaN, as ATen's g·mask.
    if (n > 15) g[15] = std::numeric_limits<float>::infinity();
    const at::Tensor cpu_dx = q::fused::mask_multiply(g, cpu.mask);
    for (const Grid& grid : grids_for(n)) {
      const std::pair<at::Tensor, at::Tensor> r = emulate_masked(x, body::SignOp{}, grid);
      const at::Tensor& mask = r.second;
      EXPECT_TRUE(same_values(r.first, cpu.output));
      EXPECT_TRUE(at::equal(mask, cpu.mask));
      at::Tensor dx = at::empty({n});
      emulate_elementwise(n, grid, [&](int64_t i) {
        dx.data_ptr<float>()[i] = body::mask_multiply_value(g.data_ptr<float>(), mask.data_ptr<uint8_t>(), i);
      });
      EXPECT_TRUE(same_values(dx, cpu_dx)) << "mask multiply";
    }
  }
}

TEST(CudaQuantizerBodies, WeightsAreTheAtenCudaFormAndTheCpuKernels) {
  at::manual_seed(23);
  for (int64_t n : kSizes)
    for (const at::Tensor& w : weights(n))
      for (const WeightCase& c : kWeightCases) {
        std::ostringstream trace;
        trace << "shape " << w.sizes() << ", " << c.name;
        SCOPED_TRACE(trace.str());
        const bool per_channel = c.granularity == q::Granularity::kPerChannel;
        const body::ChannelView v = body::channel_view(w.sizes().data(), w.dim(), c.axis, per_channel);
        const at::Tensor t = at::tanh(w).contiguous();
        const at::Tensor m = q::fused::abs_max(t, per_channel, c.axis).clamp_min(1e-12).contiguous();
        std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
        shape[static_cast<size_t>(c.axis)] = m.numel();
        const at::Tensor mb = m.reshape(shape);
        const Grid grid = grids_for(w.numel())[w.numel() > 100000 ? 2 : 1];
        for (int64_t bits : {2, 3, 4, 8}) {
          const float levels = body::dorefa_levels(static_cast<int>(bits));
          // dorefa_encode then decode_weight, the scalar divisions as CUDA does them.
          const at::Tensor codes = at::round((t / (mb * 2) + 0.5) * levels).clamp(0.0, levels);
          const at::Tensor expected = codes.mul(static_cast<double>(1.0f / levels)).mul(2).sub(1);
          at::Tensor out = at::empty_like(t);
          emulate_elementwise(t.numel(), grid, [&](int64_t i) {
            out.data_ptr<float>()[i] =
                body::dorefa_weight_value(t.data_ptr<float>(), m.data_ptr<float>(), v, levels, 1.0f / levels, i);
          });
          EXPECT_TRUE(same_values(out, expected)) << bits << " bits";
          // The same codes; decoding in [−1, 1] through code·(1/n)·2 in [0, 2]: a few ulps of 2 apart.
          EXPECT_TRUE(close_to_cpu(out, q::fused::dorefa_weight_values(t, m, bits, c.axis), 4.8e-7f))
              << bits << " bits, CPU";
        }
        const at::Tensor g = at::randn(w.sizes());
        at::Tensor dw = at::empty_like(t);
        emulate_elementwise(t.numel(), grid, [&](int64_t i) {
          dw.data_ptr<float>()[i] =
              body::dorefa_weight_grad_value(g.data_ptr<float>(), t.data_ptr<float>(), m.data_ptr<float>(), v, i);
        });
        EXPECT_TRUE(same_values(dw, q::fused::dorefa_weight_grad(g, t, m, c.axis))) << "DoReFa gradient";
        const at::Tensor finite = at::nan_to_num(w, 0.0, 0.0, 0.0).contiguous();
        const q::TwnThreshold th = q::twn_threshold(finite, c.granularity, c.axis);
        const at::Tensor delta = th.delta.contiguous(), alpha = th.alpha.contiguous();
        at::Tensor tw = at::empty_like(finite);
        emulate_elementwise(finite.numel(), grid, [&](int64_t i) {
          tw.data_ptr<float>()[i] = body::ternary_value(finite.data_ptr<float>(), delta.data_ptr<float>(),
                                                        alpha.data_ptr<float>(), v, delta.numel() > 1,
                                                        alpha.numel() > 1, i);
        });
        EXPECT_TRUE(same_values(tw, q::fused::ternary_values(finite, delta, alpha, c.axis))) << "TWN";
      }
}

// Hand-worked bodies: the mask word of 32 elements starting at 32, for n = 42 (two bytes exist
// past the first four: bytes 4 and 5), and a per-channel lookup.
TEST(CudaQuantizerBodies, MaskWordsAndChannelsByHand) {
  std::vector<uint8_t> mask(6, 0xEE);
  body::store_mask_word(mask.data(), 32, 42, 0x000002A5u);  // elements 32, 34, 37, 39, 41
  EXPECT_EQ(mask[4], 0xA5);
  EXPECT_EQ(mask[5], 0x02);
  EXPECT_EQ(mask[0], 0xEE);  // other warps' bytes untouched
  body::ChannelView v;
  v.outer = 2, v.channels = 3, v.inner = 4;  // [2, 3, 4], channel axis 1
  EXPECT_EQ(body::channel_of(0, v), 0);
  EXPECT_EQ(body::channel_of(5, v), 1);
  EXPECT_EQ(body::channel_of(11, v), 2);
  EXPECT_EQ(body::channel_of(12, v), 0);
  EXPECT_EQ(body::clip_like_std(-3.0f, 2.0f), 0.0f);
  EXPECT_EQ(body::clip_like_std(3.0f, 2.0f), 2.0f);
  EXPECT_TRUE(std::isnan(body::clip_like_std(std::nanf(""), 2.0f)));
  EXPECT_EQ(body::SignOp{}.value(-0.0f), 1.0f);
  EXPECT_EQ(body::SignOp{}.value(std::nanf("")), -1.0f);
  EXPECT_FALSE(body::SignOp{}.pass(std::nanf("")));
}

// ---- LSQ and PACT (the learned quantizers): cases shared by the host runs of their CUDA bodies
// and the GPU comparisons below. Each case is one quantizer call with a learned parameter p (LSQ's
// step, PACT's clip level α) and, for LSQ+, an offset b, through the quantizers' own entry points
// (quantize::lsq_quantize, the "pact" act_quant quantizer), so the fused-off run is the ATen form.

struct LearnedCase {
  std::string name;
  at::Tensor x, p, b;  // b undefined: no offset
  bool lsq = true;
  q::LsqGrid grid{};
  double gradient_scale = 1.0;
  int64_t axis = 0, bits = 0;
  bool after_relu = false;
};

// The points of an LSQ grid of step s and offset b worth planting: ±0, b, values at and next to
// rounding ties b + (k + 1/2)·s, the bounds b − q_n·s and b + q_p·s, and past them.
std::vector<float> grid_points(float s, float b, q::LsqGrid g) {
  const auto qn = static_cast<float>(g.q_n), qp = static_cast<float>(g.q_p);
  return {0.0f,           -0.0f,          b,
          b + 0.5f * s,   b + 1.5f * s,   b - 2.5f * s,
          b + qp * s,     b - qn * s,     b + (qp + 0.5f) * s,
          b - (qn + 0.5f) * s, b + (qp - 0.5f) * s, b - (qn - 0.5f) * s};
}

// Writes `points` into the elements first, first + stride, … of the flat contiguous t, as many as fit.
void plant(at::Tensor& t, const std::vector<float>& points, int64_t first = 0, int64_t stride = 1) {
  float* p = t.data_ptr<float>();
  for (size_t k = 0; k < points.size() && first + static_cast<int64_t>(k) * stride < t.numel(); ++k)
    p[first + static_cast<int64_t>(k) * stride] = points[k];
}

// The cases for activations and weights of n elements: LSQ per tensor (signed and unsigned grid,
// the unsigned one with an offset), per channel along axis 0 of [3, n] and axis 1 of [n, 3], at 2,
// 4 and 8 bits; PACT at 2 and 4 bits with and without the folded ReLU. Each case's own grid points,
// rounding ties and bounds are planted where there is room (per channel: each channel's); one case
// of each kind also has NaN and ±inf (their gradient sums are NaN: values and input gradients are
// what they check).
std::vector<LearnedCase> learned_cases(int64_t n) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<LearnedCase> cases;
  for (const int64_t bits : {2, 4, 8}) {
    const q::LsqGrid sg = q::lsq_signed_grid(bits), ug = q::lsq_unsigned_grid(bits);
    const std::string b = std::to_string(bits) + " bits";
    const float s = 0.1f, s_plus = 0.05f, b_plus = -0.3f;
    at::Tensor x = (at::randn({n}) * 0.4).contiguous();
    plant(x, grid_points(s, 0.0f, sg));
    cases.push_back({"LSQ per tensor, " + b, x, at::full({1}, s), {}, true, sg, q::lsq_gradient_scale(n, sg.q_p), 0, bits});
    at::Tensor x_plus = (at::randn({n}) * 0.4).contiguous();
    plant(x_plus, grid_points(s_plus, b_plus, ug));
    cases.push_back({"LSQ+ per tensor, " + b, x_plus, at::full({1}, s_plus), at::full({1}, b_plus), true, ug,
                     q::lsq_gradient_scale(n, ug.q_p), 0, bits});
    if (bits == 4) {
      at::Tensor special = x.clone();
      plant(special, {nan, inf, -inf, -0.0f}, 0, 2);
      cases.push_back({"LSQ per tensor, NaN and ±inf, " + b, special, at::full({1}, s), {}, true, sg, 1.0, 0, bits});
    }
    if (n > 1) {
      const std::vector<float> steps0 = {0.01f, 0.07f, 0.2f}, steps1 = {0.02f, 0.05f, 0.3f};
      at::Tensor rows = (at::randn({3, n}) * at::tensor({0.05f, 0.3f, 1.0f}).reshape({3, 1})).contiguous();
      at::Tensor cols = (at::randn({n, 3}) * at::tensor({0.05f, 0.3f, 1.0f})).contiguous();
      for (int64_t c = 0; c < 3; ++c) {
        plant(rows, grid_points(steps0[static_cast<size_t>(c)], 0.0f, sg), c * n);  // row c
        plant(cols, grid_points(steps1[static_cast<size_t>(c)], 0.0f, sg), c, 3);   // column c
      }
      cases.push_back({"LSQ per channel, axis 0, " + b, rows, at::tensor(steps0), {}, true, sg, 1.0, 0, bits});
      cases.push_back({"LSQ per channel, axis 1, " + b, cols, at::tensor(steps1), {}, true, sg, 1.0, 1, bits});
    }
    if (bits <= 4)
      for (const bool relu : {false, true}) {
        const float alpha = 0.9f;
        at::Tensor a = (at::randn({n}) * 0.6 + 0.3).contiguous();
        plant(a, {0.0f, -0.0f, alpha, alpha * 0.5f, 2.0f * alpha, -1.0f, alpha / 3.0f * 0.5f}, 0, 5);
        LearnedCase c{"PACT " + b + (relu ? ", after ReLU" : ""), a, at::full({1}, alpha), {}, false};
        c.bits = bits;
        c.after_relu = relu;
        cases.push_back(c);
        if (bits == 2 && !relu) {
          at::Tensor special = a.clone();
          plant(special, {nan, inf, -inf}, 1, 5);
          LearnedCase sc{"PACT, NaN and ±inf, " + b, special, at::full({1}, alpha), {}, false};
          sc.bits = bits;
          cases.push_back(sc);
        }
      }
  }
  return cases;
}

struct LearnedResult {
  at::Tensor y, gx, gp, gb;  // gb undefined without an offset
};

// The case's quantizer on `device` with the fused kernels on or off, backward with `up`.
LearnedResult run_learned(const LearnedCase& c, const at::Tensor& up, bool fused, at::Device device) {
  FusedSetting setting(fused);
  // Fresh leaves (cases share tensors; a leaf's gradient would accumulate over runs).
  const auto leaf = [&](const at::Tensor& t) { return t.detach().clone().to(device).set_requires_grad(true); };
  const at::Tensor x = leaf(c.x), p = leaf(c.p);
  const at::Tensor b = c.b.defined() ? leaf(c.b) : at::Tensor();
  at::Tensor y;
  if (c.lsq) {
    y = q::lsq_quantize(x, p, c.grid, c.gradient_scale, c.axis, b);
  } else {
    Node node;
    node.name = "act";
    node.op = "act_quant";
    node.attrs["method"] = std::string("pact");
    node.attrs["activation_bits"] = c.bits;
    node.attrs["relu"] = int64_t{c.after_relu};
    node.params.set("act_clip", p);
    y = q::activation_quantizer_of(node).forward(node, x, true);
  }
  y.backward(up.to(device));
  const auto cpu = [](const at::Tensor& t) { return t.defined() ? t.detach().cpu() : t; };
  return {cpu(y), cpu(x.grad()), cpu(p.grad()), b.defined() ? cpu(b.grad()) : at::Tensor()};
}

// Bit for bit (the sign of a zero included); any NaN matches any NaN.
::testing::AssertionResult same_bits(const at::Tensor& actual, const at::Tensor& expected) {
  const ::testing::AssertionResult values = same_values(actual, expected);
  if (!values) return values;
  const at::Tensor a = actual.detach().contiguous().flatten(), e = expected.detach().contiguous().flatten();
  const at::Tensor ok = (a.view(at::kInt) == e.view(at::kInt)) | (a.isnan() & e.isnan());
  if (ok.all().item<bool>()) return ::testing::AssertionSuccess();
  const int64_t i = (~ok).nonzero()[0][0].item<int64_t>();
  return ::testing::AssertionFailure() << (~ok).sum().item<int64_t>() << " of " << a.numel()
                                       << " elements differ in the sign of a zero; first at flat index " << i;
}

void expect_same_learned(const LearnedResult& actual, const LearnedResult& expected) {
  EXPECT_TRUE(same_bits(actual.y, expected.y)) << "values";
  EXPECT_TRUE(same_bits(actual.gx, expected.gx)) << "input gradient";
  EXPECT_TRUE(same_bits(actual.gp, expected.gp)) << "parameter gradient";
  ASSERT_EQ(actual.gb.defined(), expected.gb.defined());
  if (expected.gb.defined()) {
    EXPECT_TRUE(same_bits(actual.gb, expected.gb)) << "offset gradient";
  }
}

// LSQ's and PACT's CUDA bodies (lsq_value, lsq_grad_terms, pact_value, pact_grad_terms) over every
// element on the host, against the ATen forms on the CPU (the fused kernels off): values, input
// gradients and the parameter gradients (the bodies' terms summed as the ATen forms sum their
// products, times LSQ's gradient scale), bit for bit. The ATen forms divide by a step tensor, not
// a host scalar, which ATen does as a true division on CUDA as on the CPU: the CPU ATen form is
// the CUDA one.
TEST(CudaQuantizerBodies, LsqAndPactAreTheAtenForms) {
  q::register_all();
  at::manual_seed(29);
  for (const int64_t n : {1, 31, 33, 4099})
    for (const LearnedCase& c : learned_cases(n)) {
      SCOPED_TRACE(c.name + ", n " + std::to_string(n));
      const at::Tensor up = at::randn(c.x.sizes());
      const LearnedResult aten = run_learned(c, up, false, at::kCPU);
      const at::Tensor x = c.x.contiguous(), g = up.contiguous();
      const int64_t numel = x.numel();
      at::Tensor y = at::empty(x.sizes()), gx = at::empty(x.sizes()), tp = at::empty(x.sizes()), tb = at::empty(x.sizes());
      float *yp = y.data_ptr<float>(), *gxp = gx.data_ptr<float>(), *tpp = tp.data_ptr<float>(), *tbp = tb.data_ptr<float>();
      const Grid grid = grids_for(numel)[1];
      LearnedResult body_result;
      if (c.lsq) {
        const at::Tensor steps = c.p.clamp_min(q::lsq_step_floor(at::kFloat)).contiguous();  // the step at its floor
        const at::Tensor offset = c.b.defined() ? c.b.contiguous() : at::Tensor();
        const float* bp = offset.defined() ? offset.data_ptr<float>() : nullptr;
        const body::ChannelView v = steps.numel() > 1 ? body::channel_view(x.sizes().data(), x.dim(), c.axis, true)
                                                      : body::ChannelView{1, 1, numel, false};
        const float lo = -static_cast<float>(c.grid.q_n), hi = static_cast<float>(c.grid.q_p);
        emulate_elementwise(numel, grid, [&](int64_t i) {
          yp[i] = body::lsq_value(x.data_ptr<float>(), steps.data_ptr<float>(), bp, v, lo, hi, i);
          const body::LsqGradTerms t =
              body::lsq_grad_terms(g.data_ptr<float>(), x.data_ptr<float>(), steps.data_ptr<float>(), bp, v, lo, hi, i);
          gxp[i] = t.input;
          tpp[i] = t.step;
          tbp[i] = t.offset;
        });
        const at::Tensor summed = steps.numel() == 1 ? tp.sum()
                                                     : tp.movedim(c.axis, 0).reshape({steps.numel(), -1}).sum(1);
        body_result = {y, gx, (summed.reshape(c.p.sizes()) * c.gradient_scale).to(at::kFloat),
                       c.b.defined() ? (tb.sum() * c.gradient_scale).reshape(c.b.sizes()).to(at::kFloat) : at::Tensor()};
      } else {
        // α at its floor, s = α/(2^k − 1) in double rounded to float (pact.cpp).
        const at::Tensor alpha = c.p.clamp_min(1e-6).reshape({1}).contiguous();
        const at::Tensor step = (alpha.to(at::kDouble) / static_cast<double>((int64_t{1} << c.bits) - 1)).to(at::kFloat);
        emulate_elementwise(numel, grid, [&](int64_t i) {
          yp[i] = body::pact_value(x.data_ptr<float>(), alpha.data_ptr<float>(), step.data_ptr<float>(), i);
          const body::PactGradTerms t =
              body::pact_grad_terms(g.data_ptr<float>(), x.data_ptr<float>(), alpha.data_ptr<float>(), c.after_relu, i);
          gxp[i] = t.input;
          tpp[i] = t.alpha;
        });
        body_result = {y, gx, tp.sum().reshape({1}), at::Tensor()};
      }
      expect_same_learned(body_result, aten);
    }
}

// Hand-worked LSQ and PACT bodies: step 0.5 on the 2-bit signed grid [−2, 1], offset 0.25
// (LSQ+), α = 1.5 at 2 bits (s = 0.5); NaN stays NaN.
TEST(CudaQuantizerBodies, LsqAndPactByHand) {
  const float x[] = {0.3f, 0.25f, 0.75f, -1.4f, 2.0f, std::nanf("")};
  const float step[] = {0.5f}, offset[] = {0.25f};
  const body::ChannelView v{1, 1, 6, false};
  // x/s = 0.6, 0.5 (a tie: to 0), 1.5 (clamped to 1), −2.8 (to −2), 4 (to 1).
  EXPECT_EQ(body::lsq_value(x, step, nullptr, v, -2.0f, 1.0f, 0), 0.5f);
  EXPECT_EQ(body::lsq_value(x, step, nullptr, v, -2.0f, 1.0f, 1), 0.0f);
  EXPECT_EQ(body::lsq_value(x, step, nullptr, v, -2.0f, 1.0f, 2), 0.5f);
  EXPECT_EQ(body::lsq_value(x, step, nullptr, v, -2.0f, 1.0f, 3), -1.0f);
  EXPECT_EQ(body::lsq_value(x, step, nullptr, v, -2.0f, 1.0f, 4), 0.5f);
  EXPECT_TRUE(std::isnan(body::lsq_value(x, step, nullptr, v, -2.0f, 1.0f, 5)));
  // With the offset: (0.75 − 0.25)/0.5 = 1 → 1·0.5 + 0.25 = 0.75.
  EXPECT_EQ(body::lsq_value(x, step, offset, v, -2.0f, 1.0f, 2), 0.75f);
  const float g[] = {2.0f, 2.0f, 2.0f, 2.0f, 2.0f, 2.0f};
  // Inside (v = 0.6): input 2, step 2·(round(0.6) − 0.6) = 2·0.4, offset 0.
  body::LsqGradTerms t = body::lsq_grad_terms(g, x, step, offset, v, -2.0f, 1.0f, 0);  // (0.3 − 0.25)/0.5 = 0.1
  EXPECT_EQ(t.input, 2.0f);
  EXPECT_FLOAT_EQ(t.step, 2.0f * (0.0f - 0.1f));
  EXPECT_EQ(t.offset, 0.0f);
  t = body::lsq_grad_terms(g, x, step, nullptr, v, -2.0f, 1.0f, 3);  // below: v = −2.8
  EXPECT_EQ(t.input, 0.0f);
  EXPECT_EQ(t.step, -4.0f);
  EXPECT_EQ(t.offset, 2.0f);
  t = body::lsq_grad_terms(g, x, step, nullptr, v, -2.0f, 1.0f, 2);  // v = 1.5: at or above q_p
  EXPECT_EQ(t.input, 0.0f);
  EXPECT_EQ(t.step, 2.0f);
  const float alpha[] = {1.5f}, s[] = {0.5f};
  EXPECT_EQ(body::pact_value(x, alpha, s, 0), 0.5f);  // 0.6 → 1
  EXPECT_EQ(body::pact_value(x, alpha, s, 3), 0.0f);  // clipped at 0
  EXPECT_EQ(body::pact_value(x, alpha, s, 4), 1.5f);  // clipped at α
  EXPECT_TRUE(std::isnan(body::pact_value(x, alpha, s, 5)));
  const float edge[] = {0.0f, 1.5f};
  EXPECT_EQ(body::pact_grad_terms(g, edge, alpha, false, 0).input, 2.0f);  // x = 0 passes
  EXPECT_EQ(body::pact_grad_terms(g, edge, alpha, true, 0).input, 0.0f);   // not after a ReLU
  EXPECT_EQ(body::pact_grad_terms(g, edge, alpha, false, 1).input, 0.0f);  // x = α goes to α
  EXPECT_EQ(body::pact_grad_terms(g, edge, alpha, false, 1).alpha, 2.0f);
}

// ---- CUDA: the same comparisons on the GPU (FusedQuantizersCuda), against the ATen-op forms on the
// GPU: ATen's CUDA division by a scalar multiplies by its float reciprocal, which the CUDA kernels
// follow (quantize/quantize_cuda.cu), so CPU and CUDA values may differ in the last bits where the
// reciprocal is inexact, or by one level at a rounding midpoint (see close_to_cpu); the masks,
// which are comparisons, equal the CPU's bit for bit. Skipped
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

// Every grid-stride loop taken more than once: launches capped at 2 blocks (512 threads), over
// sizes that need 1, 2 and 1,954 trips, against the CUDA form written as CPU ATen ops and the CPU
// kernels.
TEST_F(FusedQuantizersCuda, GridStrideLoopsCoverEveryElement) {
#ifdef WHITTLE_WITH_CUDA  // the grid limit exists where the CUDA kernels are compiled (SetUp skips elsewhere)
  struct Restore {
    unsigned previous = q::detail::set_quantize_cuda_grid_limit(2);
    ~Restore() { q::detail::set_quantize_cuda_grid_limit(previous); }
  } restore;
  // Leaves the caching allocator holding blocks of 0xFF bytes (a NaN as float) of an output's and
  // a mask's sizes, which the next launch's outputs take: an element a kernel skips shows.
  const auto poison = [](int64_t n) {
    const at::TensorOptions bytes = at::TensorOptions().dtype(at::kByte).device(at::kCUDA);
    at::Tensor a = at::full({4 * n}, 255, bytes), b = at::full({(n + 7) / 8}, 255, bytes);
  };
  at::manual_seed(9);
  for (const int64_t n : {511, 513, 1000003}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const at::Tensor x = activations(n, 2.0);
    const q::fused::MaskedOutput cpu = q::fused::dorefa_activation(x, 4, 2.0, true);
    const at::Tensor x_gpu = on_gpu(x);
    poison(n);
    const q::fused::MaskedOutput gpu = q::fused::dorefa_activation(x_gpu, 4, 2.0, true);
    EXPECT_TRUE(same_values(gpu.output.cpu(), dorefa_activation_cuda_form(x, 4, 2.0f)));
    EXPECT_TRUE(at::equal(gpu.mask.cpu(), cpu.mask));
    const q::fused::MaskedOutput cpu_sign = q::fused::sign(x, true);
    poison(n);
    const q::fused::MaskedOutput gpu_sign = q::fused::sign(x_gpu, true);
    EXPECT_TRUE(same_values(gpu_sign.output.cpu(), cpu_sign.output));
    EXPECT_TRUE(at::equal(gpu_sign.mask.cpu(), cpu_sign.mask));
    const at::Tensor g = at::randn({1, n});
    const at::Tensor w = (at::randn({n}) * 0.1).reshape({1, n});
    const at::Tensor t = at::tanh(w);
    const at::Tensor m = q::fused::abs_max(t, false, 0).clamp_min(1e-12);
    const at::Tensor delta = at::full({1}, 0.05f), alpha = at::full({1}, 0.2f);
    const at::Tensor g_gpu = on_gpu(g), w_gpu = on_gpu(w), t_gpu = on_gpu(t), m_gpu = on_gpu(m);
    const at::Tensor delta_gpu = on_gpu(delta), alpha_gpu = on_gpu(alpha);
    poison(n);
    EXPECT_TRUE(same_values(q::fused::mask_multiply(g_gpu, gpu.mask).cpu(), q::fused::mask_multiply(g, cpu.mask)));
    poison(n);
    EXPECT_TRUE(close_to_cpu(q::fused::dorefa_weight_values(t_gpu, m_gpu, 4, 0).cpu(),
                             q::fused::dorefa_weight_values(t, m, 4, 0), 4.8e-7f));
    poison(n);
    EXPECT_TRUE(same_values(q::fused::dorefa_weight_grad(g_gpu, t_gpu, m_gpu, 0).cpu(),
                            q::fused::dorefa_weight_grad(g, t, m, 0)));
    poison(n);
    EXPECT_TRUE(same_values(q::fused::ternary_values(w_gpu, delta_gpu, alpha_gpu, 0).cpu(),
                            q::fused::ternary_values(w, delta, alpha, 0)));
  }
#endif
}

// LSQ (per tensor and per channel, with and without the offset) and PACT: the CUDA kernels against
// the ATen forms on the GPU, values and every gradient bit for bit (the kernels' per-element terms
// are the ATen forms' products, summed by the same ATen reductions).
TEST_F(FusedQuantizersCuda, LsqAndPactEqualTheAtenForm) {
  q::register_all();
  at::manual_seed(31);
  for (const int64_t n : {1, 31, 33, 1000003})
    for (const LearnedCase& c : learned_cases(n)) {
      SCOPED_TRACE(c.name + ", n " + std::to_string(n));
      const at::Tensor up = at::randn(c.x.sizes());
      expect_same_learned(run_learned(c, up, true, at::kCUDA), run_learned(c, up, false, at::kCUDA));
    }
}

TEST(FusedQuantizers, CudaKernelsAreOffUntilAsked) {
  // Off by default (until checked on a GPU), so CUDA tensors take the ATen-op forms; the switch holds.
  if (std::getenv("WHITTLE_FUSED_QUANTIZERS_CUDA") == nullptr) {
    EXPECT_FALSE(q::fused_quantizers_cuda_enabled());
  }
  const bool previous = q::fused_quantizers_cuda_enabled();
  q::set_fused_quantizers_cuda(true);
  EXPECT_TRUE(q::fused_quantizers_cuda_enabled());
  q::set_fused_quantizers_cuda(previous);
  EXPECT_EQ(q::fused_quantizers_cuda_enabled(), previous);
}

}  // namespace
}  // namespace whittle::test
