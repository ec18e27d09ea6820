// Affine int8 quantization (quantize/int8.cpp) and the calibrators it brought (entropy,
// moving-average min-max): hand-worked values throughout.
//   - The entropy calibrator on a histogram whose KL optimum is worked out in the comment, and on
//     evenly spaced values (nothing to clip: min-max's step); the moving averages by hand.
//   - The activation quantizer: ties (round half to even before the zero point is added, as ONNX's
//     QuantizeLinear), the zero point at both ends of the code range, the gradient mask, signed
//     codes, the ReLU it stands for; the QAT observers and their freezing.
//   - Weight scales per output channel on grouped and transposed convolutions (axis 1), narrow and
//     full range, an all-zero and a constant channel.
//   - LeNet-5 calibrated by each calibrator, saved and loaded bitwise, weights one byte each.
//   - Bad recipe keys named.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_util.h"
#include "export/checkpoint.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "quantize/calibrate.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "support.h"
#include "test_models.h"

namespace whittle::test {
namespace {

namespace q = whittle::quantize;

at::Tensor vec(std::vector<double> v) { return at::tensor(v, at::TensorOptions().dtype(at::kDouble)); }

double step_of(const std::string& calibrator, const q::Histogram& h, q::CalibrationGrid g) {
  return q::calibrator(calibrator).step(h, g, q::CalibrationOptions{});
}

// Values at the centres of bins of width w = 1/1024 (r = 1): 10 in each of the first 256 distance
// bins, and one outlier in bin 1000. On the uint8 grid (255 steps, 256 groups) the candidates are
// i = 256..1001:
//   i = 256: P = the 256 bins with the outlier added to the last (11), Q = the bins themselves (one
//     a group): KL = (2550/2561)·ln(2560/2561) + (11/2561)·ln(2816/2561) = 1.9e-5;
//   256 < i ≤ 1000: the outlier lands in bin i − 1, empty in Q, which smoothing gives 1e-4 of a
//     count: at least (1/2561)·ln(1/1e-4) = 3.6e-3;
//   i = 1001: P = Q on every non-empty bin, but Q's 744 empty bins take 1e-4 of a count each from
//     the 257 others (2.9e-4 each): ≈ 257·(2.9e-4/2561) = 2.9e-5.
// So T = 256·w = 0.25 and the step is 0.25/255, where min-max's is (1000.5/1024)/255.
TEST(EntropyCalibrator, ClipsAnOutlierAtTheWorkedOutThreshold) {
  std::vector<double> v;
  for (int k = 0; k < 256; ++k)
    for (int j = 0; j < 10; ++j) v.push_back((k + 0.5) / 1024.0);
  v.push_back(1000.5 / 1024.0);
  const q::Histogram h = q::histogram_of(vec(v));
  ASSERT_EQ(h.range, 1.0);
  EXPECT_DOUBLE_EQ(step_of("entropy", h, {0, 255, 0.0}), 0.25 / 255.0);
  EXPECT_DOUBLE_EQ(step_of("minmax", h, {0, 255, 0.0}), (1000.5 / 1024.0) / 255.0);
  // The same values in three batches: the same histogram, the same step.
  q::Histogram split;
  const at::Tensor all = vec(v);
  q::observe(split, all.slice(0, 0, 1000));
  q::observe(split, all.slice(0, 1000, 2000));
  q::observe(split, all.slice(0, 2000));
  EXPECT_EQ(step_of("entropy", split, {0, 255, 0.0}), step_of("entropy", h, {0, 255, 0.0}));
  // The values negated on the int8 grid: the distances are the same, 127 steps to the nearer end,
  // 128 groups; the bulk covers 256 bins, more than 128, so the search runs and again no candidate
  // beats the bulk's end (each bin of Q two of P, both equal).
  EXPECT_DOUBLE_EQ(step_of("entropy", q::histogram_of(-vec(v)), {128, 127, 0.0}), 0.25 / 127.0);
}

// Evenly spaced values fill every bin alike: no threshold below the last bin wins, and the step is
// min-max's (the largest value over 255), with or without a spike of exact zeros.
TEST(EntropyCalibrator, KeepsEvenlySpacedValuesWhole) {
  const at::Tensor x = at::arange(0, 10000, at::kDouble) / 10000.0;
  const q::Histogram h = q::histogram_of(x);
  EXPECT_DOUBLE_EQ(step_of("entropy", h, {0, 255, 0.0}), 0.9999 / 255.0);
  // As many exact zeros again (a ReLU's output): the grid holds 0 exactly, they cost nothing at
  // any threshold and change nothing (in the first bin they would outweigh it and push the
  // threshold to the smallest candidate).
  const q::Histogram with_zeros = q::histogram_of(at::cat({x, at::zeros({10000}, at::kDouble)}));
  EXPECT_EQ(with_zeros.zeros, 10001);
  EXPECT_DOUBLE_EQ(step_of("entropy", with_zeros, {0, 255, 0.0}), 0.9999 / 255.0);
}

// m ← m + 0.01·(batch − m): batches [0, 1, 2] then [−1, 4] give min −0.01 and max 2.02.
TEST(MovingMinMaxCalibrator, MovingAveragesByHand) {
  q::Histogram h;
  q::observe(h, vec({0.0, 1.0, 2.0}));
  q::observe(h, vec({-1.0, 4.0}));
  EXPECT_EQ(h.batches, 2);
  EXPECT_DOUBLE_EQ(h.moving_min, -0.01);
  EXPECT_DOUBLE_EQ(h.moving_max, 2.02);
  EXPECT_DOUBLE_EQ(step_of("moving_minmax", h, {0, 255, 0.0}), 2.02 / 255.0);
  EXPECT_DOUBLE_EQ(step_of("moving_minmax", h, {128, 127, 0.0}), 2.02 / 127.0);
  EXPECT_DOUBLE_EQ(step_of("minmax", h, {128, 127, 0.0}), 4.0 / 127.0);
  // Merged with a one-batch histogram: the batch-weighted mean.
  q::merge(h, q::histogram_of(vec({-4.0, 8.0})));
  EXPECT_EQ(h.batches, 3);
  EXPECT_NEAR(h.moving_min, (2 * -0.01 - 4.0) / 3.0, 1e-15);
  EXPECT_NEAR(h.moving_max, (2 * 2.02 + 8.0) / 3.0, 1e-15);
}

// An int8 act_quant node with the given scale and zero point.
Node act_node(double scale, double zero_point, bool signed_codes, bool relu = false) {
  Node n = make("a", "act_quant", {"x"}, {{"method", std::string("int8")}, {"signed_codes", signed_codes}, {"relu", relu}});
  n.buffers.set("act_scale", at::full({1}, scale, at::kFloat));
  n.buffers.set("act_zero_point", at::full({1}, zero_point, at::kFloat));
  return n;
}

// s = 0.5, z = 3, uint8: x/s = 0.5 → round 0 (half to even) → code 3 → 0; 1.5 → 2 → code 5 → 1.0;
// −3 → code 0 → −1.5; −4 → code −1, clamped to 0 → −1.5 (gradient 0); 254 → code 257, clamped to
// 255 → 126 (gradient 0); 2.5 → 2 → 1.0. (Rounding x/s + z instead would give 0.5 + 3 → 4 → 0.5.)
TEST(Int8Activations, TiesZeroPointAndClampsByHand) {
  q::register_all();
  const Node n = act_node(0.5, 3.0, false);
  const at::Tensor x = at::tensor({0.25f, 0.75f, -1.5f, -2.0f, 127.0f, 1.25f}).set_requires_grad(true);
  const at::Tensor y = q::activation_quantizers().get("int8").forward(n, x, true);
  EXPECT_TRUE(at::equal(y, at::tensor({0.0f, 1.0f, -1.5f, -1.5f, 126.0f, 1.0f})));
  y.sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), at::tensor({1.0f, 1.0f, 1.0f, 0.0f, 0.0f, 1.0f})));
  // Signed codes [−128, 127], z = 0, s = 0.25: −32.5 → −130 → −128 → −32; 31.875 → 127.5 → 128 →
  // 127 → 31.75; −0.125 → −0.5 → −0 → 0.
  const Node s = act_node(0.25, 0.0, true);
  EXPECT_TRUE(at::equal(q::activation_quantizers().get("int8").forward(s, at::tensor({-32.5f, 31.875f, -0.125f}), false),
                        at::tensor({-32.0f, 31.75f, 0.0f})));
  // Standing for a ReLU: negative inputs give 0 even on the signed grid.
  const Node r = act_node(0.25, 0.0, true, true);
  EXPECT_TRUE(at::equal(q::activation_quantizers().get("int8").forward(r, at::tensor({-3.0f, 0.3f}), false),
                        at::tensor({0.0f, 0.25f})));
  // The grid the ONNX writer reads.
  const q::ActivationGrid g = q::activation_quantizers().get("int8").grid(n);
  EXPECT_TRUE(g.affine);
  EXPECT_EQ(g.zero_point, 3);
  EXPECT_FALSE(g.signed_codes);
  EXPECT_EQ(g.max / 255.0, 0.5);
}

// Calibration puts the zero point where the range says: [0, 3] → z = 0, s = 3/255; [−2, 0] → z =
// 255 (every code at or below zero), s = 2/255; [−1, 3] → s₀ = 4/255, z = round(1/s₀) =
// round(63.75) = 64, then min-max's step for the grid [−64, 191] around it: max(3/191, 1/64) =
// 3/191. int8 codes: z = 0, max(3/127, 1/128) = 3/127. A histogram of zeros: s = 1, z = 0.
TEST(Int8Activations, CalibratedZeroPointsByHand) {
  q::register_all();
  const q::ActivationQuantizer& aq = q::activation_quantizers().get("int8");
  struct Case {
    std::vector<double> values;
    bool signed_codes;
    float scale;
    float zero_point;
  };
  for (const Case& c : {Case{{0.0, 1.0, 3.0}, false, 3.0f / 255.0f, 0.0f}, Case{{-2.0, -0.5, 0.0}, false, 2.0f / 255.0f, 255.0f},
                        Case{{-1.0, 0.5, 3.0}, false, static_cast<float>(3.0 / 191.0), 64.0f},
                        Case{{-1.0, 0.5, 3.0}, true, static_cast<float>(3.0 / 127.0), 0.0f},
                        Case{{0.0, 0.0}, false, 1.0f, 0.0f}}) {
    Node n = act_node(1.0, 0.0, c.signed_codes);
    aq.calibrate(n, q::histogram_of(vec(c.values)), q::calibrator("minmax"), {});
    EXPECT_EQ(n.buffers.at("act_scale").item<float>(), c.scale) << c.values[0] << " " << c.signed_codes;
    EXPECT_EQ(n.buffers.at("act_zero_point").item<float>(), c.zero_point) << c.values[0] << " " << c.signed_codes;
    aq.check(n);
  }
  // The ends of [−2, 0] are on the grid: −2 → code 0, 0 → code 255.
  Node n = act_node(1.0, 0.0, false);
  aq.calibrate(n, q::histogram_of(vec({-2.0, 0.0})), q::calibrator("minmax"), {});
  const at::Tensor y = aq.forward(n, at::tensor({-2.0f, 0.0f, 0.5f}), false);
  EXPECT_FLOAT_EQ(y[0].item<float>(), -255.0f * (2.0f / 255.0f));
  EXPECT_EQ(y[1].item<float>(), 0.0f);
  EXPECT_EQ(y[2].item<float>(), 0.0f);  // above the grid: clamped to code 255, which is 0
  // A zero point off the grid or not integral is refused, naming the node.
  EXPECT_THROW(aq.check(act_node(0.1, 3.5, false)), Error);
  EXPECT_THROW(aq.check(act_node(0.1, 256.0, false)), Error);
  EXPECT_THROW(aq.check(act_node(0.1, 3.0, true)), Error);
  EXPECT_THROW(aq.check(act_node(0.0, 0.0, false)), Error);
}

// Observers (QAT): calibrated on [0, 2] (uint8: s = 2/255, z = 0, observed range [0, 2]); a training
// batch with min −1 and max 4 moves the range to [−0.01, 2.02]; then z = round(0.01·255/2.03) =
// round(1.256) = 1 and min-max's step for the grid [−1, 254]: max(2.02/254, 0.01/1) = 0.01. In eval
// mode, or with observe off, nothing moves. The method's schedule clears observe at
// freeze_observers_epoch.
TEST(Int8Activations, ObserversMoveTheScaleUntilFrozen) {
  q::register_all();
  const q::ActivationQuantizer& aq = q::activation_quantizers().get("int8");
  Node n = act_node(1.0, 0.0, false);
  n.attrs["observe"] = true;
  n.buffers.set("observed_min", at::zeros({1}));
  n.buffers.set("observed_max", at::zeros({1}));
  aq.calibrate(n, q::histogram_of(vec({0.0, 2.0})), q::calibrator("minmax"), {});
  EXPECT_EQ(n.buffers.at("act_scale").item<float>(), 2.0f / 255.0f);
  EXPECT_EQ(n.buffers.at("observed_max").item<float>(), 2.0f);
  const at::Tensor batch = at::tensor({-1.0f, 4.0f, 0.5f});
  aq.forward(n, batch, /*training=*/false);
  EXPECT_EQ(n.buffers.at("act_scale").item<float>(), 2.0f / 255.0f);  // eval: no update
  const at::Tensor y = aq.forward(n, batch, /*training=*/true);
  EXPECT_FLOAT_EQ(n.buffers.at("observed_min").item<float>(), -0.01f);
  EXPECT_FLOAT_EQ(n.buffers.at("observed_max").item<float>(), 2.02f);
  EXPECT_EQ(n.buffers.at("act_zero_point").item<float>(), 1.0f);
  EXPECT_EQ(n.buffers.at("act_scale").item<float>(), 0.01f);
  // −1 → code round(−100) + 1, clamped to 0 → −0.01; 4 → 401 → 255 → 2.54; 0.5 → 51 → 0.5.
  EXPECT_TRUE(at::allclose(y, at::tensor({-0.01f, 2.54f, 0.5f}), 0, 1e-6));

  // The schedule: observe on every quantized input until epoch 1, then off.
  Graph g = small_net();
  q::Config c;
  c.method = "int8";
  c.options["observe"] = true;
  c.options["freeze_observers_epoch"] = 1.0;
  c.targets = {"classifier"};
  q::apply(g, c);
  // The classifier's input quantizer is the ReLU before max pooling and flatten (whole_network).
  const Node& act = g.node("features.2");
  EXPECT_EQ(act.op, "act_quant");
  EXPECT_TRUE(act.attr_bool("observe"));
  const q::Config resolved = q::resolve(c);
  EXPECT_EQ(q::at_epoch(g, resolved, 0.99), 0);
  EXPECT_EQ(q::at_epoch(g, resolved, 1.0), 1);
  EXPECT_FALSE(g.node("features.2").attr_bool("observe"));
  EXPECT_EQ(q::at_epoch(g, resolved, 2.0), 0);  // already frozen
}

// Data-parallel QAT: two ranks' observers saw different batches; sync_replicas makes both the mean
// and derives the scale from it (here rank 1's sums are added by hand: each rank's replica_sum
// adds the other's values). Rank 0 observed [−0.2, 1.0], rank 1 [0.0, 3.0]: the mean [−0.1, 2.0],
// zero point round(0.1·255/2.1) = 12, and the step that covers both ends around it:
// max(0.1/12, 2.0/243) = 0.1/12.
TEST(Int8Activations, DataParallelObserversAverageOverTheRanks) {
  q::register_all();
  Graph g[2] = {small_net(), small_net()};
  q::Config c;
  c.method = "int8";
  c.options["observe"] = true;
  c.targets = {"classifier"};
  for (Graph& gr : g) q::apply(gr, c);
  const double lo[2] = {-0.2, 0.0}, hi[2] = {1.0, 3.0};
  for (int r = 0; r < 2; ++r) {
    g[r].node("features.2").buffers.at("observed_min").fill_(lo[r]);
    g[r].node("features.2").buffers.at("observed_max").fill_(hi[r]);
  }
  auto values = [](const Graph& gr) {
    const Node& n = gr.node("features.2");
    return at::cat({n.buffers.at("observed_min"), n.buffers.at("observed_max")}).to(at::kDouble);
  };
  const at::Tensor before[2] = {values(g[0]), values(g[1])};
  for (int r = 0; r < 2; ++r) {
    const at::Tensor other = before[1 - r];
    EXPECT_EQ(q::sync_replicas(g[r], [&](at::Tensor& t) { t += other; }, 2), 1);
    const Node& n = g[r].node("features.2");
    EXPECT_FLOAT_EQ(n.buffers.at("observed_min").item<float>(), -0.1f);
    EXPECT_FLOAT_EQ(n.buffers.at("observed_max").item<float>(), 2.0f);
    EXPECT_EQ(n.buffers.at("act_zero_point").item<float>(), 12.0f);
    EXPECT_FLOAT_EQ(n.buffers.at("act_scale").item<float>(), static_cast<float>(0.1 / 12.0));
  }
  // Frozen observers take part in no collective.
  g[0].node("features.2").attrs["observe"] = false;
  EXPECT_EQ(q::sync_replicas(g[0], [](at::Tensor&) { ADD_FAILURE() << "a collective without observers"; }, 2), 0);
}

// The whole network in int8 (whole_network, the default): a residual block
//   x → stem → relu0 → conv_a → relu_a → conv_b → add(conv_b, relu0) → relu_out → pool → flatten → fc
// gets one quantizer per value: relu0 and relu_a become quantizers (every use quantized: conv_a
// and the add; conv_b), conv_b's output one in front of the add, and relu_out the quantizer of fc's
// input through max pooling and flatten. whole_network = false quantizes only the layers' inputs:
// relu0 stays a ReLU (the add reads it) with a quantizer in front of conv_a, and fc's quantizer reads
// the flattened values.
TEST(Int8Model, WholeNetworkPlacement) {
  auto block = [] {
    Graph g;
    g.add_input("x", {1, 2, 4, 4});
    auto conv = [&](const std::string& name, const std::string& in) {
      Node n = make(name, "conv2d", {in}, {{"padding", std::vector<int64_t>{1, 1}}});
      n.params.set("weight", at::randn({2, 2, 3, 3}));
      g.add_node(n);
    };
    conv("stem", "x");
    g.add_node(make("relu0", "relu", {"stem"}));
    conv("conv_a", "relu0");
    g.add_node(make("relu_a", "relu", {"conv_a"}));
    conv("conv_b", "relu_a");
    g.add_node(make("add", "add", {"conv_b", "relu0"}));
    g.add_node(make("relu_out", "relu", {"add"}));
    g.add_node(make("pool", "max_pool2d", {"relu_out"}, {{"kernel_size", int64_t{2}}}));
    g.add_node(make("flatten", "flatten", {"pool"}));
    Node fc = make("fc", "linear", {"flatten"});
    fc.params.set("weight", at::randn({3, 8}));
    g.add_node(fc);
    g.set_outputs({"fc"});
    g.infer_shapes();
    return g;
  };
  q::Config c;
  c.method = "int8";
  Graph g = block();
  const q::Report r = q::apply(g, c);
  EXPECT_EQ(r.quantized, (std::vector<std::string>{"stem", "conv_a", "conv_b", "fc"}));
  EXPECT_EQ(r.replaced, (std::vector<std::string>{"relu0", "relu_a", "relu_out"}));
  EXPECT_EQ(r.inserted, (std::vector<std::string>{"stem.act_quant", "add.act_quant"}));
  EXPECT_EQ(g.node("add").inputs, (std::vector<std::string>{"add.act_quant", "relu0"}));
  EXPECT_EQ(g.node("add.act_quant").inputs, (std::vector<std::string>{"conv_b"}));
  EXPECT_EQ(g.node("conv_a").inputs.at(0), "relu0");
  EXPECT_EQ(g.node("pool").inputs.at(0), "relu_out");
  EXPECT_EQ(g.node("fc").inputs.at(0), "flatten");
  for (const char* name : {"relu0", "relu_a", "relu_out"}) EXPECT_EQ(g.node(name).attr_int("relu"), 1) << name;

  // A second apply changes nothing: every layer is quantized, and the add reads quantizers already.
  const q::Report again = q::apply(g, c);
  EXPECT_TRUE(again.inserted.empty() && again.replaced.empty() && again.quantized.empty());
  EXPECT_EQ(g.node("add").inputs, (std::vector<std::string>{"add.act_quant", "relu0"}));

  c.options["whole_network"] = false;
  Graph h = block();
  const q::Report layers_only = q::apply(h, c);
  EXPECT_EQ(layers_only.replaced, (std::vector<std::string>{"relu_a"}));
  EXPECT_EQ(layers_only.inserted, (std::vector<std::string>{"stem.act_quant", "conv_a.act_quant", "fc.act_quant"}));
  EXPECT_EQ(h.node("add").inputs, (std::vector<std::string>{"conv_b", "relu0"}));
  EXPECT_EQ(h.node("relu0").op, "relu");
  EXPECT_EQ(h.node("fc.act_quant").inputs.at(0), "flatten");
}

// An ImageNet stem: x → stem → relu0 → pool (max, padding 1) → {conv_a, add}. The pool's output has
// two readers, both quantized inputs, so the quantizer still stands at relu0 (through the pool, which
// commutes with it): the stem requantizes into it, the pool moves codes, and conv_a and the add read
// them; no quantizer after the pool.
TEST(Int8Model, StemMaxPoolingReadByABlockKeepsOneQuantizerBeforeIt) {
  Graph g;
  g.add_input("x", {1, 2, 8, 8});
  auto conv = [&](const std::string& name, const std::string& in) {
    Node n = make(name, "conv2d", {in}, {{"padding", std::vector<int64_t>{1, 1}}});
    n.params.set("weight", at::randn({2, 2, 3, 3}));
    g.add_node(n);
  };
  conv("stem", "x");
  g.add_node(make("relu0", "relu", {"stem"}));
  g.add_node(make("pool", "max_pool2d", {"relu0"},
                  {{"kernel_size", int64_t{3}}, {"stride", int64_t{2}}, {"padding", std::vector<int64_t>{1, 1}}}));
  conv("conv_a", "pool");
  g.add_node(make("relu_a", "relu", {"conv_a"}));
  conv("conv_b", "relu_a");
  g.add_node(make("add", "add", {"conv_b", "pool"}));
  g.set_outputs({"add"});
  g.infer_shapes();
  q::Config c;
  c.method = "int8";
  const q::Report r = q::apply(g, c);
  EXPECT_EQ(r.replaced, (std::vector<std::string>{"relu0", "relu_a"}));
  EXPECT_EQ(r.inserted, (std::vector<std::string>{"stem.act_quant", "add.act_quant"}));
  EXPECT_EQ(g.node("pool").inputs.at(0), "relu0");
  EXPECT_EQ(g.node("conv_a").inputs.at(0), "pool");
  EXPECT_EQ(g.node("add").inputs, (std::vector<std::string>{"add.act_quant", "pool"}));
  EXPECT_EQ(g.node("relu0").op, "act_quant");
}

// Weight scales per output channel: a grouped conv (axis 0) and a transposed conv (axis 1, weight
// [in, out/groups, k, k]); narrow range s = m/127, full range s = m/127.5 (then −m is code −128
// and +m rounds to 128, clamped to 127); an all-zero channel gets s = 1 and codes 0.
TEST(Int8Weights, ScalesPerOutputChannelByHand) {
  Graph g;
  g.add_input("x", {1, 4, 2, 2});
  Node grouped = make("grouped", "conv2d", {"x"}, {{"groups", int64_t{2}}});
  // Output channels: max |w| 2.54, 0 (all zero), 1.27 (constant), 0.5.
  grouped.params.set("weight", at::tensor({2.54f, -1.0f, 0.0f, 0.0f, 1.27f, 1.27f, -0.5f, 0.25f}).reshape({4, 2, 1, 1}));
  g.add_node(grouped);
  Node deconv = make("deconv", "conv_transpose2d", {"grouped"});
  // [in 4, out 2, 1, 1]: output channel 0 reads 1, −3, 0.5, 2 (max 3), channel 1 reads 0.1, 0.2, −0.3, 0.4 (max 0.4).
  deconv.params.set("weight", at::tensor({1.0f, 0.1f, -3.0f, 0.2f, 0.5f, -0.3f, 2.0f, 0.4f}).reshape({4, 2, 1, 1}));
  g.add_node(deconv);
  g.add_node(make("relu", "relu", {"deconv"}));
  Node fc = make("fc", "conv2d", {"relu"});
  fc.params.set("weight", at::randn({3, 2, 1, 1}));
  g.add_node(fc);
  g.set_outputs({"fc"});
  for (bool narrow : {true, false}) {
    Graph copy = g;
    q::Config c;
    c.method = "int8";
    c.activation_bits = 32;
    c.options["narrow_range"] = narrow;
    c.targets = {"grouped", "deconv"};
    q::apply(copy, c);
    const float levels = narrow ? 127.0f : 127.5f;
    const q::EncodedWeight a = q::encode_node_weight(copy.node("grouped"));
    EXPECT_EQ(a.axis, 0);
    EXPECT_TRUE(at::equal(a.scale, at::tensor({2.54f / levels, 1.0f, 1.27f / levels, 0.5f / levels})));
    const q::EncodedWeight b = q::encode_node_weight(copy.node("deconv"));
    EXPECT_EQ(b.axis, 1);
    EXPECT_TRUE(at::equal(b.scale, at::tensor({3.0f / levels, 0.4f / levels})));
    // Codes (stored + 128): the largest magnitude of each channel is ±127 (full range: −3 → −128).
    const at::Tensor codes = b.codes.reshape({4, 2}) - 128;
    EXPECT_EQ(codes[1][0].item<float>(), narrow ? -127.0f : -128.0f);
    EXPECT_EQ(codes[3][1].item<float>(), 127.0f);
    const at::Tensor ga = a.codes.reshape({4, 2}) - 128;
    EXPECT_EQ(ga[1][0].item<float>(), 0.0f);  // the all-zero channel
    EXPECT_EQ(ga[2][0].item<float>(), 127.0f);  // the constant channel: both codes at the end
    EXPECT_EQ(ga[2][1].item<float>(), 127.0f);
    // Full range: +2.54 is 127.5 steps → 128 → clamped to 127.
    EXPECT_EQ(ga[0][0].item<float>(), 127.0f);
    // The forward pass gives the decoded codes, gradient straight through inside the range.
    GraphModule m(copy);
    const at::Tensor w = m->graph().node("grouped").params.at("weight");
    const at::Tensor wq = q::weight_quantizers().get("int8").forward(m->graph().node("grouped"), w, true);
    EXPECT_TRUE(at::equal(wq, q::decode_weight(a.codes, a.scale, a.encoding, a.bits, a.axis, at::kFloat)));
    // The all-zero channel quantizes exactly, the constant one to 127 steps: 1.27 in narrow range,
    // 127·1.27/127.5 in full range.
    EXPECT_TRUE(at::equal(wq[1], at::zeros({2, 1, 1})));
    EXPECT_FLOAT_EQ(wq[2][0][0][0].item<float>(), narrow ? 1.27f : 127.0f * (1.27f / 127.5f));
  }
}

// LeNet-5 with each calibrator: activation scales and zero points set over two batches, then saved
// and loaded: the same outputs bitwise, weights one byte each, the scales kept as buffers.
TEST(Int8Model, CalibratedLeNetReloadsBitwise) {
  for (const char* name : {"minmax", "moving_minmax", "percentile", "entropy", "mse"}) {
    SCOPED_TRACE(name);
    at::manual_seed(3);
    GraphModule m{build_model("lenet5", ZooOptions{})};
    q::Config c;
    c.method = "int8";
    c.options["calibrator"] = std::string(name);
    c.options["calibration_batches"] = int64_t{2};
    // Without first_and_last the first and last layers stay float, as with the low-bit methods.
    q::Config edges_float = c;
    edges_float.options["first_and_last"] = false;
    EXPECT_EQ(q::select_layers(m->graph(), edges_float).quantized,
              (std::vector<std::string>{"conv2", "fc1", "fc2"}));
    const q::Report r = q::apply(m, c);
    EXPECT_EQ(r.quantized.size(), 5u);  // every layer, the first and last too, as int8 runtimes run them
    const std::vector<at::Tensor> batches = {at::randn({8, 1, 28, 28}), at::randn({8, 1, 28, 28})};
    m->eval();
    const std::optional<q::Calibration> cal = q::quantizer_method("int8").calibration(q::resolve(c));
    ASSERT_TRUE(cal.has_value());
    EXPECT_EQ(q::calibrate_learned(m, [&](int64_t i) { return batches.at(static_cast<size_t>(i)); }, *cal,
                                   q::nodes_to_initialize(m->graph(), r)),
              5);
    for (const Node& n : m->graph().nodes())
      if (n.op == "act_quant") {
        EXPECT_GT(n.buffers.at("act_scale").item<float>(), 0.0f) << n.name;
        const float z = n.buffers.at("act_zero_point").item<float>();
        if (n.name == "conv1.act_quant")  // the image, N(0, 1): the zero point near the middle of [0, 255]
          EXPECT_TRUE(z > 100.0f && z < 155.0f) << z;
        else
          EXPECT_EQ(z, 0.0f) << n.name;  // after ReLUs: nothing negative
      }
    const at::Tensor x = at::randn({4, 1, 28, 28});
    at::Tensor y;
    {
      at::NoGradGuard no_grad;
      y = m->forward({x})[0];
    }
    const std::string path = join_path(binary_dir(), "int8_lenet5_" + std::string(name) + ".h5");
    save_checkpoint(path, m->graph());
    GraphModule loaded{load_checkpoint(path).graph};
    loaded->eval();
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(loaded->forward({x})[0], y));
    const Node& conv2 = loaded->graph().node("conv2");
    EXPECT_EQ(conv2.attr_int("weight_bits"), 8);
    EXPECT_EQ(conv2.buffers.at("weight_codes").numel(), 16 * 6 * 5 * 5);  // one byte a weight
    EXPECT_EQ(conv2.buffers.at("weight_scale").numel(), 16);
  }
}

// Bias correction by hand: fc (weight [1, 0.004], bias 0.5) reading [1, 2] through a uint8 grid
// calibrated on it (s = 2/255, z = 0: the input becomes [128·s, 255·s]). The weight scale is 1/127,
// so 0.004 becomes 1 step, Δ = [0, 1/127 − 0.004]; the mean error is 255·s·Δ₁ and the bias drops
// by it.
TEST(Int8Model, BiasCorrectionByHand) {
  Graph g;
  g.add_input("x", {1, 2});
  Node fc = make("fc", "linear", {"x"});
  fc.params.set("weight", at::tensor({1.0f, 0.004f}).reshape({1, 2}));
  fc.params.set("bias", at::tensor({0.5f}));
  g.add_node(fc);
  g.set_outputs({"fc"});
  q::Config c;
  c.method = "int8";
  c.targets = {"fc"};
  GraphModule m(g);
  const q::Report r = q::apply(m, c);
  m->eval();
  const at::Tensor x = at::tensor({1.0f, 2.0f}).reshape({1, 2});
  q::Calibration cal;
  cal.calibrator = "minmax";
  ASSERT_EQ(q::calibrate_learned(m, [&](int64_t) { return x; }, cal), 1);
  EXPECT_EQ(q::correct_bias(m, [&](int64_t) { return x; }, 1, r.quantized), 1);
  const float s = 2.0f / 255.0f, step = 1.0f / 127.0f;
  EXPECT_NEAR(m->graph().node("fc").params.at("bias").item<float>(), 0.5f - 255.0f * s * (step - 0.004f), 1e-7);
  // A layer without a bias gets one; a float layer is left alone.
  Graph h = g;
  h.node("fc").params.erase("bias");
  GraphModule n(h);
  const q::Report rn = q::apply(n, c);
  n->eval();
  q::calibrate_learned(n, [&](int64_t) { return x; }, cal);
  EXPECT_EQ(q::correct_bias(n, [&](int64_t) { return x; }, 1, rn.quantized), 1);
  EXPECT_NEAR(n->graph().node("fc").params.at("bias").item<float>(), -255.0f * s * (step - 0.004f), 1e-7);
  GraphModule f(g);
  EXPECT_EQ(q::correct_bias(f, [&](int64_t) { return x; }, 1, {"fc"}), 0);
  // A linear layer on [N, T, features] (a token MLP): its channels are the last axis, every
  // position counts, and the correction is the same.
  Graph t;
  t.add_input("x", {1, 3, 2});
  Node fresh = fc;  // its own tensors: the corrections above changed the shared bias in place
  fresh.params.set("weight", fc.params.at("weight").clone());
  fresh.params.set("bias", at::tensor({0.5f}));
  t.add_node(fresh);
  t.set_outputs({"fc"});
  GraphModule tm(t);
  const q::Report rt = q::apply(tm, c);
  tm->eval();
  const at::Tensor xt = x.reshape({1, 1, 2}).expand({1, 3, 2}).contiguous();
  q::calibrate_learned(tm, [&](int64_t) { return xt; }, cal);
  EXPECT_EQ(q::correct_bias(tm, [&](int64_t) { return xt; }, 1, rt.quantized), 1);
  ASSERT_EQ(tm->graph().node("fc").params.at("bias").numel(), 1);
  EXPECT_NEAR(tm->graph().node("fc").params.at("bias").item<float>(), 0.5f - 255.0f * s * (step - 0.004f), 1e-7);
}

// Keys the int8 method refuses, each named.
TEST(Int8Model, BadKeysAreNamed) {
  auto refusal = [&](const q::Config& c) { return usage_error_message([&] { q::resolve(c); }); };
  q::Config c;
  c.method = "int8";
  c.options["calibrator"] = std::string("kl");
  EXPECT_NE(refusal(c).find("'calibrator': unknown 'kl'"), std::string::npos) << refusal(c);
  c.options["calibrator"] = std::string("entropy");
  c.options["percentile"] = 99.9;
  EXPECT_NE(refusal(c).find("'percentile'"), std::string::npos) << refusal(c);
  c.options = q::Config{}.options;
  c.weight_bits = 4;
  EXPECT_NE(refusal(c).find("weight_bits = 4"), std::string::npos) << refusal(c);
  c.weight_bits = 8;
  c.options["activation_dtype"] = std::string("int4");
  EXPECT_NE(refusal(c).find("int4"), std::string::npos) << refusal(c);
  c.options = q::Config{}.options;
  c.options["freeze_observers_epoch"] = 2.0;
  EXPECT_NE(refusal(c).find("observe: true"), std::string::npos) << refusal(c);
  c.options["freeze_observers_epoch"] = -0.5;
  EXPECT_NE(refusal(c).find("freeze_observers_epoch"), std::string::npos) << refusal(c);
}

}  // namespace
}  // namespace whittle::test
