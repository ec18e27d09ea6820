// Calibration (quantize/calibrate.h): the int64 histogram (bins worked out by hand, a first batch of
// zeros, a growing range, the same counts however the values are split into batches or ranks, no
// change on a NaN), the calibrators' steps on hand-worked cases (min-max, percentile, the MSE
// optimum derived in the comment), and LSQ started from a calibrator: weight steps per channel
// and activation steps over two batches, equal to the calibrator on the values the layers see.
// No accuracy floors: counts are exact, and each step is compared with the calibrator run on the
// same tensors in the same process; every case passes with 1 and 2 intra-op threads,
// ATEN_CPU_CAPABILITY=default and WHITTLE_KERNEL_ISA=scalar (checked).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/registry.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "quantize/calibrate.h"
#include "quantize/lsq.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "thread_sum.h"

namespace whittle::test {
namespace {

namespace q = whittle::quantize;

at::Tensor vec(std::vector<double> v) { return at::tensor(v, at::TensorOptions().dtype(at::kDouble)); }

double step_of(const std::string& calibrator, const q::Histogram& h, q::CalibrationGrid g,
               q::CalibrationOptions o = {}) {
  return q::calibrator(calibrator).step(h, g, o);
}

// [0.25, −0.5, 1.5]: max|x| = 1.5 → r = 2, w = 4/2048 = 1/512, bin ⌊(x + 2)·512⌋ = 1152, 768,
// 1792. Then 3.0: r = 4, bins merge in pairs: bin i → (i + 1024)/2 = 1088, 896, 1408, and 3.0 →
// ⌊7·256⌋ = 1792. The same as the histogram of all four values at once.
TEST(Histogram, BinsByHandAndAGrowingRange) {
  q::Histogram h;
  q::observe(h, vec({0.25, -0.5, 1.5}));
  EXPECT_EQ(h.range, 2.0);
  ASSERT_EQ(h.counts.size(), 2048u);
  EXPECT_EQ(h.counts[1152], 1);
  EXPECT_EQ(h.counts[768], 1);
  EXPECT_EQ(h.counts[1792], 1);
  q::observe(h, vec({3.0}));
  EXPECT_EQ(h.range, 4.0);
  std::map<int64_t, int64_t> nonzero;
  for (int64_t i = 0; i < 2048; ++i)
    if (h.counts[i]) nonzero[i] = h.counts[i];
  EXPECT_EQ(nonzero, (std::map<int64_t, int64_t>{{896, 1}, {1088, 1}, {1408, 1}, {1792, 1}}));
  EXPECT_EQ(h.counts, q::histogram_of(vec({0.25, -0.5, 1.5, 3.0})).counts);
  EXPECT_EQ(h.count, 4);
  EXPECT_EQ(h.min, -0.5);
  EXPECT_EQ(h.max, 3.0);
  EXPECT_DOUBLE_EQ(h.abs_sum, 5.25);
  EXPECT_DOUBLE_EQ(h.center(1792), -4.0 + 1792.5 / 256.0);
}

// A first batch of zeros has no range; the zeros are counted apart, at 0 exactly, whatever comes
// after. A range that grows more than 2^11-fold collapses the old bins onto the two around 0.
TEST(Histogram, ZerosFirstAndAHugeGrowth) {
  q::Histogram h;
  q::observe(h, at::zeros({5}));
  EXPECT_EQ(h.range, 0.0);
  EXPECT_TRUE(h.counts.empty());
  EXPECT_EQ(h.zeros, 5);
  EXPECT_EQ(h.count, 5);
  q::observe(h, vec({-1e-3, 2e-3, 0.0}));
  EXPECT_EQ(h.zeros, 6);
  EXPECT_EQ(h.range, 1.0 / 256);  // 2^−8 > 2e-3 ≥ 2^−9
  q::observe(h, vec({1000.0}));
  EXPECT_EQ(h.range, 1024.0);
  EXPECT_EQ(h.counts[1023], 1);  // −1e-3: just below 0
  EXPECT_EQ(h.counts[1024], 1);  // 2e-3: just above
  EXPECT_EQ(h.counts, q::histogram_of(vec({0, 0, 0, 0, 0, -1e-3, 2e-3, 0, 1000})).counts);
}

// The same values in one batch, in uneven batches whose range grows, and merged from two
// observers: the same counts, so the same steps.
TEST(Histogram, SameCountsHoweverTheValuesAreSplit) {
  at::manual_seed(3);
  const at::Tensor x = at::cat({at::randn({4000}) * 0.01, at::randn({3000}) * 5, at::zeros({500}),
                                at::rand({2500}) * 40})
                           .to(at::kFloat);
  const q::Histogram whole = q::histogram_of(x);
  q::Histogram pieces, a, b;
  int64_t start = 0;
  for (int64_t size : {1, 3999, 2000, 1500, 2500}) {
    q::observe(pieces, x.slice(0, start, start + size));
    start += size;
  }
  q::observe(a, x.slice(0, 0, 5000));
  q::observe(b, x.slice(0, 5000, 10000));
  q::merge(a, b);
  for (const q::Histogram* h : {&pieces, &a}) {
    EXPECT_EQ(h->range, whole.range);
    EXPECT_EQ(h->counts, whole.counts);
    EXPECT_EQ(h->zeros, whole.zeros);
    EXPECT_EQ(h->count, 10000);
    EXPECT_EQ(h->min, whole.min);
    EXPECT_EQ(h->max, whole.max);
    for (const char* c : {"minmax", "percentile", "mse"})
      EXPECT_EQ(step_of(c, *h, {8, 7, 0.0}), step_of(c, whole, {8, 7, 0.0})) << c;
  }
}

// A NaN, an infinity or a value beyond float32 is refused, naming the input, and the histogram stays
// as it was.
TEST(Histogram, NonFiniteValuesAreRefusedWithoutChange) {
  q::Histogram h = q::histogram_of(vec({1.0, 2.0}));
  const std::vector<int64_t> before = h.counts;
  try {
    q::observe(h, vec({3.0, std::nan("")}), "node 'x'");
    FAIL() << "a NaN was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a NaN, infinite or beyond-float32 value"), std::string::npos) << e.what();
  }
  EXPECT_THROW(q::observe(h, vec({INFINITY})), Error);
  EXPECT_THROW(q::observe(h, vec({1e300})), Error);  // finite, but beyond float32
  EXPECT_EQ(h.counts, before);
  EXPECT_EQ(h.count, 2);
  EXPECT_EQ(h.max, 2.0);
}

// min-max: [0, 1, 3] on the unsigned 4-bit grid [0, 15]: s = 3/15; [−4, 2] on the signed [−8, 7]:
// max(2/7, 4/8) = 0.5; with an offset β = −1 on [0, 15]: (3 − (−1))/15.
TEST(Calibrators, MinMaxByHand) {
  EXPECT_DOUBLE_EQ(step_of("minmax", q::histogram_of(vec({0, 1, 3})), {0, 15, 0.0}), 0.2);
  EXPECT_DOUBLE_EQ(step_of("minmax", q::histogram_of(vec({-4, 2})), {8, 7, 0.0}), 0.5);
  EXPECT_DOUBLE_EQ(step_of("minmax", q::histogram_of(vec({-1, 3})), {0, 15, -1.0}), 4.0 / 15);
}

// 99 values at 1 and one at 10 on the 1-bit grid {0, s}. For 2/3 < s < 2 (1/s rounds to 1) the
// error is 99·(1 − s)² + (10 − s)², least where 200s = 198·1 + 2·10: s = 1.09 (error 80.19); for s
// ≥ 2 it is at least 99 (every 1 rounds to 0), and min-max's s = 10 gives 99. The histogram sees
// the bin centres (r = 16, w = 1/64: 1 + 1/128 and 10 + 1/128), whose optimum is
// (198·(1 + 1/128) + 2·(10 + 1/128))/200 = 1.0978; the search finds it within s_max/256/32.
TEST(Calibrators, MseOptimumByHand) {
  std::vector<double> v(99, 1.0);
  v.push_back(10.0);
  const q::Histogram h = q::histogram_of(vec(v));
  const double s = step_of("mse", h, {0, 1, 0.0});
  EXPECT_NEAR(s, (198.0 * (1 + 1.0 / 128) + 2.0 * (10 + 1.0 / 128)) / 200.0, 10.0 / 256 / 32);
  EXPECT_NEAR(s, 1.09, 0.01);
  EXPECT_LT(q::histogram_squared_error(h, {0, 1, 0.0}, s), q::histogram_squared_error(h, {0, 1, 0.0}, 10.0));
  EXPECT_DOUBLE_EQ(step_of("minmax", h, {0, 1, 0.0}), 10.0);
}

// Percentile 99 of 0.001·(1..1000): the grid [0, 15] reaches the 990th value, 0.99, within one bin
// (r = 2, w = 1/512); 99.9 the 999th (though 99.9/100·1000 rounds above 999); 100
// reaches the maximum. Values below a grid without negative levels are clipped to 0 whatever the
// step, so 1,000 values of −5 beside them change nothing. 9,999 zeros and one 0.01 at 99.99 %:
// the share is covered at 0, and the step is min-max's, not one that rounds 0.01 to 0.
TEST(Calibrators, PercentileByHand) {
  const at::Tensor x = at::arange(1, 1001, at::kDouble) * 0.001;
  const q::Histogram h = q::histogram_of(x);
  q::CalibrationOptions o;
  o.percentile = 99.0;
  EXPECT_NEAR(step_of("percentile", h, {0, 15, 0.0}, o) * 15, 0.99, 1.0 / 512);
  o.percentile = 99.9;  // with the 1,000th value moved to 1.5: the 999th, not the 1,000th
  at::Tensor far = x.clone();
  far[999] = 1.5;
  EXPECT_NEAR(step_of("percentile", q::histogram_of(far), {0, 15, 0.0}, o) * 15, 0.999, 1.0 / 512);
  o.percentile = 99.0;
  const q::Histogram with_negatives = q::histogram_of(at::cat({x, at::full({1000}, -5.0, at::kDouble)}));
  EXPECT_NEAR(step_of("percentile", with_negatives, {0, 15, 0.0}, o) * 15, 0.98, 1.0 / 128);  // 1,980th of 2,000; w = 1/128
  std::vector<double> mostly_zero(9999, 0.0);
  mostly_zero.push_back(0.01);
  o.percentile = 99.99;
  EXPECT_DOUBLE_EQ(step_of("percentile", q::histogram_of(vec(mostly_zero)), {0, 15, 0.0}, o), 0.01 / 15);
  o.percentile = 99.0;
  o.percentile = 100.0;
  EXPECT_NEAR(step_of("percentile", h, {0, 15, 0.0}, o) * 15, 1.0, 1e-12);  // never past the maximum
  o.percentile = 0.0;
  EXPECT_THROW(step_of("percentile", h, {0, 15, 0.0}, o), Error);
}

// No value, or every value 0: every calibrator gives the unit step (finite, positive).
TEST(Calibrators, ZerosGiveAUnitStep) {
  for (const auto& name : q::calibrators().names()) {
    EXPECT_EQ(step_of(name, q::Histogram{}, {0, 15, 0.0}), 1.0) << name;
    EXPECT_EQ(step_of(name, q::histogram_of(at::zeros({7})), {8, 7, 0.0}), 1.0) << name;
  }
  EXPECT_THROW(q::calibrator("kl"), Error);
  for (const char* name : {"minmax", "percentile", "mse"}) EXPECT_TRUE(q::calibrators().contains(name)) << name;
  EXPECT_NE(find_registry("calibrators"), nullptr);
}

// LSQ and LSQ+ with a calibrator on LeNet-5. Each output channel's weight step is the
// calibrator's on that channel's weights; each activation step is the calibrator's on the values
// the layer reads over both batches (after the ReLU an act_quant stands for), taken from a model
// with the same quantized weights and float activations; LSQ+'s offset is their minimum.
TEST(CalibratedLsq, StepsAreTheCalibratorsOnWhatTheLayersSee) {
  for (const char* method : {"lsq", "lsq_plus"})
    for (const char* name : {"mse", "percentile"}) {
      SCOPED_TRACE(std::string(method) + ", " + name);
      at::manual_seed(4);
      const Graph base = build_model("lenet5", ZooOptions{});
      q::Config c;
      c.method = method;
      c.options["granularity"] = std::string("per_channel");
      c.options["step_init"] = std::string(name);
      c.options["init_batches"] = int64_t{2};
      q::CalibrationOptions o;
      if (std::string(name) == "percentile") {
        c.options["percentile"] = 99.0;
        o.percentile = 99.0;
      }
      GraphModule m{Graph(base)};
      q::apply(m, c);
      const Node& conv2 = m->graph().node("conv2");
      const at::Tensor w = conv2.params.at("weight").reshape({16, -1});
      for (int64_t i = 0; i < 16; ++i)
        EXPECT_FLOAT_EQ(conv2.params.at("weight_step")[i].item<float>(),
                        static_cast<float>(step_of(name, q::histogram_of(w[i]), {8, 7, 0.0}, o)))
            << "channel " << i;

      const std::vector<at::Tensor> batches = {at::randn({6, 1, 28, 28}), at::randn({5, 1, 28, 28})};
      m->eval();
      const std::optional<q::Calibration> cal = q::quantizer_method(method).calibration(q::resolve(c));
      ASSERT_TRUE(cal.has_value());
      EXPECT_EQ(cal->batches, 2);
      EXPECT_EQ(q::calibrate_learned(m, [&](int64_t i) { return batches.at(static_cast<size_t>(i)); }, *cal), 3);

      // The same weights with float activations: the act_quant inputs are values of that graph.
      q::Config weights_only = c;
      weights_only.activation_bits = 32;
      GraphModule f{Graph(base)};
      q::apply(f, weights_only);
      f->eval();
      std::vector<std::string> inputs;
      std::vector<const Node*> acts;
      for (const Node& n : m->graph().nodes())
        if (n.op == "act_quant") {
          acts.push_back(&n);
          inputs.push_back(n.inputs.at(0));
        }
      ASSERT_EQ(acts.size(), 3u);
      std::vector<q::Histogram> seen(acts.size());
      int64_t relus = 0;
      for (const auto& b : batches) {
        std::map<std::string, at::Tensor> captured;
        f->forward_with_intermediates({b}, inputs, &captured);
        for (size_t i = 0; i < acts.size(); ++i) {
          const bool relu = acts[i]->attr_bool("relu");
          relus += relu;
          q::observe(seen[i], relu ? at::relu(captured.at(inputs[i])) : captured.at(inputs[i]));
        }
      }
      EXPECT_EQ(relus, 2);  // fc2's input, in both batches: a ReLU the act_quant stands for
      for (size_t i = 0; i < acts.size(); ++i) {
        const at::Tensor* offset = acts[i]->params.find("act_offset");
        q::CalibrationGrid g{0, 15, 0.0};
        if (offset) {
          g.offset = seen[i].min;
          EXPECT_FLOAT_EQ(offset->item<float>(), static_cast<float>(seen[i].min)) << acts[i]->name;
        }
        const float want = static_cast<float>(step_of(name, seen[i], g, o));
        EXPECT_FLOAT_EQ(acts[i]->params.at("act_step").item<float>(), want) << acts[i]->name;
        EXPECT_NE(want, 1.0f);
      }
    }
}

// PACT with clip_calibrator: each α is the calibrator's step for [0, 15] times 15 on what the
// layer reads (its weights are DoReFa's, so a DoReFa W4A32 model gives the same float inputs).
TEST(CalibratedPact, ClipsAreTheCalibratorsOnWhatTheLayersSee) {
  at::manual_seed(7);
  const Graph base = build_model("lenet5", ZooOptions{});
  q::Config c;
  c.method = "pact";
  c.options["clip_calibrator"] = std::string("mse");
  c.options["init_batches"] = int64_t{2};
  GraphModule m{Graph(base)};
  const q::Report r = q::apply(m, c);
  EXPECT_EQ(q::nodes_to_initialize(m->graph(), r).size(), 3u);  // PACT's nodes start from data too
  const std::vector<at::Tensor> batches = {at::randn({6, 1, 28, 28}), at::randn({5, 1, 28, 28})};
  m->eval();
  const std::optional<q::Calibration> cal = q::quantizer_method("pact").calibration(q::resolve(c));
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(q::calibrate_learned(m, [&](int64_t i) { return batches.at(static_cast<size_t>(i)); }, *cal), 3);
  q::Config reference;
  reference.method = "dorefa";
  reference.weight_bits = 4;
  reference.activation_bits = 32;
  GraphModule f{Graph(base)};
  q::apply(f, reference);
  f->eval();
  for (const Node& n : m->graph().nodes()) {
    if (n.op != "act_quant") continue;
    q::Histogram seen;
    for (const auto& b : batches) {
      std::map<std::string, at::Tensor> captured;
      f->forward_with_intermediates({b}, {n.inputs.at(0)}, &captured);
      const at::Tensor x = captured.at(n.inputs.at(0));
      q::observe(seen, n.attr_bool("relu") ? at::relu(x) : x);
    }
    EXPECT_FLOAT_EQ(n.params.at("act_clip").item<float>(), static_cast<float>(step_of("mse", seen, {0, 15, 0.0}) * 15))
        << n.name;
  }
  // clip_init and clip_calibrator together, an unknown calibrator, init_batches without one.
  auto message = [](const q::Config& bad) {
    try {
      q::resolve(bad);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (auto [key, value, want] : std::vector<std::tuple<std::string, SettingValue, std::string>>{
           {"clip_init", SettingValue(2.0), "key 'clip_init': give clip_init or clip_calibrator, not both"},
           {"clip_calibrator", SettingValue(std::string("kl")), "unknown 'kl' (entropy, minmax, moving_minmax, mse, percentile)"}}) {
    q::Config bad = c;
    bad.options[key] = value;
    EXPECT_NE(message(bad).find(want), std::string::npos) << message(bad);
  }
  q::Config bad;
  bad.method = "pact";
  bad.options["init_batches"] = int64_t{3};
  EXPECT_NE(message(bad).find("3 batches need a clip_calibrator"), std::string::npos) << message(bad);
}

// Two ranks' histograms merged over the ranks equal the histogram of all the values, on both ranks:
// one rank's values reach 40, the other's only 3 (another range), and a rank that saw only zeros
// (no range) merges too.
TEST(Histogram, MergedOverRanksIsTheWholeHistogram) {
  at::manual_seed(5);
  const at::Tensor a = at::cat({at::randn({3000}) * 10, at::tensor({40.0f})});
  const at::Tensor b = at::cat({at::rand({2000}) * 3, at::zeros({100})});
  for (bool zeros_only : {false, true}) {
    const at::Tensor second = zeros_only ? at::zeros({100}) : b;
    const q::Histogram whole = q::histogram_of(at::cat({a, second}));
    ThreadSum ranks(2);
    q::Histogram h0 = q::histogram_of(a), h1 = q::histogram_of(second);
    auto sum = [&](at::Tensor& t) { ranks(t); };
    std::thread other([&] { q::merge_over_ranks(h1, sum, 1, 2); });
    q::merge_over_ranks(h0, sum, 0, 2);
    other.join();
    for (const q::Histogram* h : {&h0, &h1}) {
      EXPECT_EQ(h->range, whole.range);
      EXPECT_EQ(h->counts, whole.counts);
      EXPECT_EQ(h->zeros, whole.zeros);
      EXPECT_EQ(h->count, whole.count);
      EXPECT_EQ(h->min, whole.min);
      EXPECT_EQ(h->max, whole.max);
      EXPECT_NEAR(h->abs_sum, whole.abs_sum, 1e-9 * whole.abs_sum);
    }
  }
}

// The recipe keys are checked: an unknown calibrator is named with the known ones; init_batches
// needs a calibrator; a percentile outside (0, 100] is refused.
TEST(CalibratedLsq, BadKeysAreRefused) {
  auto message = [](std::map<std::string, SettingValue> options) {
    q::Config c;
    c.method = "lsq";
    for (auto& [k, v] : options) c.options[k] = v;
    try {
      q::resolve(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string unknown = message({{"step_init", SettingValue(std::string("kl"))}});
  EXPECT_NE(unknown.find("unknown 'kl' (paper, entropy, minmax, moving_minmax, mse, percentile)"), std::string::npos) << unknown;
  EXPECT_NE(message({{"init_batches", SettingValue(int64_t{4})}}).find("need step_init"), std::string::npos);
  const std::string zero =
      message({{"step_init", SettingValue(std::string("percentile"))}, {"percentile", SettingValue(0.0)}});
  EXPECT_NE(zero.find("percentile"), std::string::npos) << zero;
  EXPECT_EQ(message({{"step_init", SettingValue(std::string("percentile"))}, {"percentile", SettingValue(100.0)}}), "");
  const std::string unread = message({{"step_init", SettingValue(std::string("mse"))}, {"percentile", SettingValue(99.0)}});
  EXPECT_NE(unread.find("read only with step_init: percentile"), std::string::npos) << unread;
}

}  // namespace
}  // namespace whittle::test
