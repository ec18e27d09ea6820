// The pieces of today's binary networks: RPReLU and RSign (ReActNet, Liu et al. 2020), the sign's
// gradients (Bi-Real's ApproxSign, IR-Net's EDE at its schedule points), Libra-PB's standardized
// weights (IR-Net), the bireal_shortcuts pass (Bi-Real Net), RSign's threshold folded with the BN
// before it, channel pruning of the new per-channel tensors, and the binary methods' stages
// (W32A1, then W1A1). Values worked out by hand in the comments.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "fuse/bn_threshold.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "graph/pass_registry.h"
#include "graph/zoo.h"
#include "quantize/binary.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "support.h"

namespace whittle::test {
namespace {

namespace q = whittle::quantize;

at::Tensor vec(std::vector<float> v) { return at::tensor(v, at::TensorOptions().dtype(at::kFloat)); }

void expect_close(const at::Tensor& got, std::vector<double> want, double tol = 1e-6) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << got;
  const at::Tensor g = got.detach().to(at::kDouble).reshape({-1});
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(g[static_cast<int64_t>(i)].item<double>(), want[i], tol) << "element " << i << " of " << got;
}

Node node(const std::string& name, const std::string& op, std::vector<std::string> inputs,
          std::map<std::string, Attr> attrs = {}) {
  return q::make_node(name, op, std::move(inputs), std::move(attrs));
}

// `graph` with its activations binarized by `method` (learned thresholds), weights left float.
q::Config binarize_activations(Graph& graph, const std::string& method, q::Report* report = nullptr) {
  q::Config c;
  c.method = method;
  c.weight_bits = 32;
  c.activation_bits = 1;
  c.options["learned_threshold"] = true;
  const q::Report r = q::apply(graph, c);
  if (report) *report = r;
  return c;
}

// x [1, 2, 1, 3]: channel 0 [−1, 0.5, 2], channel 1 [−2, 0, 1]; γ = [0.5, −1], β = [0.25, 2],
// ζ = [0.1, −0.3].
// Channel 0: x − γ = [−1.5, 0, 1.5] → PReLU [−0.375, 0, 1.5] → + 0.1 = [−0.275, 0.1, 1.6].
// Channel 1: x − γ = [−1, 1, 2] → PReLU [−2, 1, 2] → − 0.3 = [−2.3, 0.7, 1.7].
// Upstream gradient 1: ∂/∂x = β where x − γ ≤ 0 else 1: [0.25, 0.25, 1], [2, 1, 1]; ∂/∂γ = −Σ∂/∂x
// = [−1.5, −4]; ∂/∂β = Σ min(x − γ, 0) = [−1.5, −1]; ∂/∂ζ = [3, 3].
TEST(Rprelu, ValuesAndGradientsByHand) {
  q::register_all();
  Node n = node("rp", "rprelu", {"x"});
  const at::Tensor gamma = vec({0.5f, -1.0f}).set_requires_grad(true);
  const at::Tensor beta = vec({0.25f, 2.0f}).set_requires_grad(true);
  const at::Tensor zeta = vec({0.1f, -0.3f}).set_requires_grad(true);
  n.params.set("shift_in", gamma);
  n.params.set("slope", beta);
  n.params.set("shift_out", zeta);
  const at::Tensor x = vec({-1.0f, 0.5f, 2.0f, -2.0f, 0.0f, 1.0f}).reshape({1, 2, 1, 3}).set_requires_grad(true);
  const at::Tensor y = op_traits("rprelu").forward(n, {x}, true)[0];
  expect_close(y, {-0.275, 0.1, 1.6, -2.3, 0.7, 1.7});
  y.sum().backward();
  expect_close(x.grad(), {0.25, 0.25, 1, 2, 1, 1});
  expect_close(gamma.grad(), {-1.5, -4});
  expect_close(beta.grad(), {-1.5, -1});
  expect_close(zeta.grad(), {3, 3});
  // A shift of another width is named.
  n.params.set("slope", vec({0.25f, 2.0f, 1.0f}));
  Graph g;
  g.add_input("x", {1, 2, 1, 3});
  EXPECT_THROW(
      {
        try {
          g.add_node(n);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("slope has shape [3] but the input has 2 channels"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

// Channel pruning keeps RPReLU's and RSign's per-channel tensors with their channels.
TEST(Rprelu, ChannelTensorsAreSlicedWithTheirChannels) {
  q::register_all();
  Node n = node("rp", "rprelu", {"x"});
  n.params.set("shift_in", vec({1, 2, 3, 4}));
  n.params.set("slope", vec({5, 6, 7, 8}));
  n.params.set("shift_out", vec({9, 10, 11, 12}));
  slice_channel_tensors(n, ChannelRole::kChannel, {0, 2});
  expect_close(n.params.at("shift_in"), {1, 3});
  expect_close(n.params.at("slope"), {5, 7});
  expect_close(n.params.at("shift_out"), {9, 11});
  Node a = node("a", "act_quant", {"x"}, {{"method", std::string("rsign")}});
  a.params.set("shift", vec({0.1f, 0.2f, 0.3f}));
  slice_channel_tensors(a, ChannelRole::kChannel, {1, 2});
  expect_close(a.params.at("shift"), {0.2, 0.3});
}

// RSign with β = [0.5, −1] on x [1, 2, 1, 2]: channel 0 [0.4, 0.6] → x − β = [−0.1, 0.1] → [−1, +1];
// channel 1 [−1, −2.5] → x − β = [0, −1.5] → [+1, −1] (sign(0) = +1).
// STE (1 where |x − β| ≤ 1): ∂/∂x = [1, 1, 1, 0], ∂/∂β = −[2, 1].
// ApproxSign (2 − 2|x − β| inside (−1, 1)): ∂/∂x = [1.8, 1.8, 2, 0], ∂/∂β = −[3.6, 2].
TEST(Rsign, ValuesAndGradientsByHand) {
  q::register_all();
  for (const std::string gradient : {"ste", "approx_sign"}) {
    Node a = node("a", "act_quant", {"x"}, {{"method", std::string("rsign")}, {"sign_gradient", gradient}});
    const at::Tensor beta = vec({0.5f, -1.0f}).set_requires_grad(true);
    a.params.set("shift", beta);
    const at::Tensor x = vec({0.4f, 0.6f, -1.0f, -2.5f}).reshape({1, 2, 1, 2}).set_requires_grad(true);
    const at::Tensor y = op_traits("act_quant").forward(a, {x}, true)[0];
    expect_close(y, {-1, 1, 1, -1});
    y.sum().backward();
    if (gradient == "ste") {
      expect_close(x.grad(), {1, 1, 1, 0});
      expect_close(beta.grad(), {-2, -1});
    } else {
      expect_close(x.grad(), {1.8, 1.8, 2, 0}, 1e-5);
      expect_close(beta.grad(), {-3.6, -2}, 1e-5);
    }
  }
}

// EDE: t = t_min·10^(p·log10(t_max/t_min)): 0.1, 1 and 10 at p = 0, 0.5, 1 (t_min 0.1, t_max 10);
// the gradient k·t·(1 − tanh²(t·x)), k = max(1/t, 1), at x = [0, 0.5, −2]:
//   t = 0.1 (k = 10): [1, 1 − tanh²(0.05) = 0.99750416, 1 − tanh²(0.2) = 0.96104298]
//   t = 1   (k = 1):  [1, 1 − tanh²(0.5) = 0.78644773, 1 − tanh²(2) = 0.07065082]
//   t = 10  (k = 1):  [10, 10·(1 − tanh²(5)) = 0.00181583, 10·(1 − tanh²(20)) ≈ 0]
TEST(Ede, ScheduleAndGradientByHand) {
  EXPECT_NEAR(q::ede_t(0.0, 0.1, 10.0), 0.1, 1e-12);
  EXPECT_NEAR(q::ede_t(0.5, 0.1, 10.0), 1.0, 1e-12);
  EXPECT_NEAR(q::ede_t(1.0, 0.1, 10.0), 10.0, 1e-12);
  EXPECT_NEAR(q::ede_t(2.0, 0.1, 10.0), 10.0, 1e-12);  // clamped
  const std::vector<std::pair<double, std::vector<double>>> points = {
      {0.1, {1.0, 0.99750416, 0.96104298}}, {1.0, {1.0, 0.78644773, 0.07065082}}, {10.0, {10.0, 0.00181583, 0.0}}};
  for (const auto& [t, want] : points) {
    const at::Tensor x = vec({0.0f, 0.5f, -2.0f}).set_requires_grad(true);
    const at::Tensor y = q::sign_with_gradient(x, q::SignGradient::kEde, t);
    expect_close(y, {1, 1, -1});
    y.sum().backward();
    expect_close(x.grad(), want, 1e-6);
  }
  EXPECT_THROW(q::sign_with_gradient(vec({1.0f}).set_requires_grad(true), q::SignGradient::kEde, 0.0), Error);
}

// Libra-PB on w [2, 4]: row [1, 2, 3, 6] has mean 3 and unbiased std √(14/3) = 2.1602469 →
// [−0.9258201, −0.4629100, 0, 1.3887301]; the constant row [5, 5, 5, 5] (std 0) is only centred →
// zeros. The BNN weight of the standardized rows is [−1, −1, +1, +1] and [+1, +1, +1, +1], where
// sign(w) alone is +1 everywhere.
TEST(LibraPb, StandardizedWeightsByHand) {
  q::register_all();
  const at::Tensor w = vec({1, 2, 3, 6, 5, 5, 5, 5}).reshape({2, 4});
  expect_close(q::libra_standardize(w, 0), {-0.9258201, -0.4629100, 0, 1.3887301, 0, 0, 0, 0});
  Node layer = node("fc", "linear", {"x"}, {{"weight_bits", int64_t{1}}, {"weight_axis", int64_t{0}},
                                            {"weight_standardize", int64_t{1}}});
  layer.weight_transforms = {"bnn"};
  const q::WeightQuantizer& bnn = q::weight_quantizers().get("bnn");
  expect_close(bnn.forward(layer, w, false), {-1, -1, 1, 1, 1, 1, 1, 1});
  // The packed codes decode to the same signs.
  const q::EncodedWeight e = bnn.encode(layer, w);
  expect_close(q::decode_weight(e.codes, e.scale, e.encoding, 1, 0, at::kFloat), {-1, -1, 1, 1, 1, 1, 1, 1});
  layer.attrs["weight_standardize"] = int64_t{0};
  expect_close(bnn.forward(layer, w, false), {1, 1, 1, 1, 1, 1, 1, 1});
}

// bireal_shortcuts on ResNet-20: each of its 9 basic blocks gains one add (a shortcut around its
// first convolution), its second convolution's shortcut becomes that convolution's input, and
// with activation rprelu the 18 block ReLUs become RPReLU (the stem's stays a ReLU).
TEST(BirealShortcuts, EveryBasicBlockOfResnet20) {
  q::register_all();
  Graph g = build_model("resnet20");
  auto count = [](const Graph& graph, const std::string& op) {
    int64_t c = 0;
    for (const Node& n : graph.nodes()) c += n.op == op;
    return c;
  };
  EXPECT_EQ(count(g, "add"), 9);
  const int64_t relus = count(g, "relu");
  Settings s;
  s["activation"] = std::string("rprelu");
  const std::string report = run_pass("bireal_shortcuts", g, s);
  EXPECT_EQ(count(g, "add"), 18) << report;
  EXPECT_EQ(count(g, "rprelu"), 18);
  EXPECT_EQ(count(g, "relu"), relus - 18);
  // Every conv2d inside a block: its BN's output feeds an add whose other input is the conv's own
  // input (the second convolution, and the first of a block whose shortcut is the identity: 9 + 7)
  // or the block's projection (the first convolution of the 2 blocks that downsample).
  int64_t with_own_input = 0, with_projection = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != "add") continue;
    const Node& bn = g.node(g.value(n.inputs[0]).producer);
    ASSERT_EQ(bn.op, "batch_norm") << n.name;
    const Node& conv = g.node(g.value(bn.inputs[0]).producer);
    ASSERT_EQ(conv.op, "conv2d") << n.name;
    with_own_input += n.inputs[1] == conv.inputs[0];
    with_projection += n.inputs[1].find(".shortcut.1") != std::string::npos;
  }
  EXPECT_EQ(with_own_input, 16);
  EXPECT_EQ(with_projection, 2);
  // The rewritten model runs, and its RPReLUs start with the slope asked for.
  GraphModule m(g);
  m->eval();
  const at::Tensor y = m->forward(at::randn({2, 3, 32, 32}));
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{2, 10}));
  for (const Node& n : g.nodes())
    if (n.op == "rprelu") expect_close(n.params.at("slope").mean().reshape({1}), {0.25});
  // A model without basic blocks is refused, naming what the pass looks for.
  Graph lenet = build_model("lenet5");
  try {
    run_pass("bireal_shortcuts", lenet);
    ADD_FAILURE() << "LeNet-5 has no basic block";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no basic residual block"), std::string::npos) << e.what();
  }
}

// RSign's learned threshold folds into threshold_sign with the BN before it, and alone; the
// folded graph's signs are those of the graph.
TEST(Rsign, FoldsIntoThresholdsWithAndWithoutBn) {
  q::register_all();
  at::manual_seed(3);
  Graph g;
  g.add_input("x", {4, 3, 6, 6});
  Node conv = node("conv", "conv2d", {"x"}, {{"padding", std::vector<int64_t>{1, 1}}});
  conv.params.set("weight", at::randn({5, 3, 3, 3}) * 0.3);
  g.add_node(conv);
  Node bn = node("bn", "batch_norm", {"conv"});
  bn.params.set("weight", at::randn({5}));  // some γ < 0: the comparison flips
  bn.params.set("bias", at::randn({5}) * 0.2);
  bn.buffers.set("running_mean", at::randn({5}) * 0.1);
  bn.buffers.set("running_var", at::rand({5}) + 0.5);
  g.add_node(bn);
  Node sign1 = node("sign1", "act_quant", {"bn"}, {{"method", std::string("rsign")}});
  sign1.params.set("shift", at::randn({5}) * 0.3);
  g.add_node(sign1);
  Node sign2 = node("sign2", "act_quant", {"conv"}, {{"method", std::string("rsign")}});
  sign2.params.set("shift", at::randn({5}) * 0.3);
  g.add_node(sign2);
  g.set_outputs({"sign1", "sign2"});
  GraphModule m(g.clone());
  m->eval();
  const at::Tensor x = at::randn({4, 3, 6, 6});
  const auto before = m->forward(std::vector<at::Tensor>{x});
  const fuse::Report r = fuse::fold_bn_into_threshold(m);
  EXPECT_EQ(r.fused.size(), 2u) << r.summary();
  EXPECT_EQ(m->graph().node("sign1").op, "threshold_sign");
  EXPECT_EQ(m->graph().node("sign2").op, "threshold_sign");
  EXPECT_FALSE(m->graph().find_node("bn"));
  const auto after = m->forward(std::vector<at::Tensor>{x});
  ASSERT_EQ(before.size(), 2u);
  // The graph compares BN(y) − β in float, the fold y with a threshold computed in double: a value
  // within rounding of its threshold may flip on another instruction set or thread count. None did
  // here (AVX-512, 1 and 2 threads); the bound allows 2 of each output's 720 signs.
  for (size_t i = 0; i < 2; ++i)
    EXPECT_LE(before[i].ne(after[i]).sum().item<int64_t>(), 2) << "output " << i;
}

// The binary methods' stages: W32A1 binarizes activations only (RSign with a shift per input
// channel; 18 binarizers for ResNet-20's 20 layers, its projection shortcuts reading the input of
// their block's first convolution); a later W1A1 entry binarizes the weights of the same layers
// and keeps the binarizers and their learned shifts.
TEST(BinaryStages, ActivationsFirstThenWeights) {
  q::register_all();
  Graph g = build_model("resnet20");
  q::Report first;
  q::Config c = binarize_activations(g, "bnn", &first);
  ASSERT_EQ(first.quantized.size(), 20u) << first.summary();
  int64_t rsigns = 0;
  for (const Node& n : g.nodes())
    if (n.op == "act_quant") {
      EXPECT_EQ(n.attr_str("method"), "rsign");
      EXPECT_EQ(n.params.at("shift").numel(), g.value(n.inputs[0]).shape[1]) << n.name;
      ++rsigns;
    }
  EXPECT_EQ(rsigns, 18);
  for (const auto& name : first.quantized) EXPECT_TRUE(g.node(name).weight_transforms.empty());
  c.weight_bits = 1;
  EXPECT_TRUE(q::quantized_by(g, c).empty());
  const q::Report second = q::apply(g, c);
  EXPECT_EQ(second.quantized, first.quantized);
  EXPECT_TRUE(second.inserted.empty()) << second.summary();
  for (const auto& name : second.quantized) EXPECT_EQ(g.node(name).weight_transforms.back(), "bnn");
  int64_t act_quants = 0;
  for (const Node& n : g.nodes()) act_quants += n.op == "act_quant";
  EXPECT_EQ(act_quants, 18);
}

// LeNet-5's binarizers reach conv2 and fc1 through max pooling and flatten: each RSign still gets
// its shift, and the W1A1 stage neither adds a second binarizer behind those ops nor loses one.
TEST(BinaryStages, BinarizersBehindPoolingAndFlatten) {
  q::register_all();
  Graph g = build_model("lenet5");
  q::Config c = binarize_activations(g, "bnn");
  auto binarizers = [&] {
    int64_t count = 0;
    for (const Node& n : g.nodes())
      if (n.op == "act_quant") {
        EXPECT_TRUE(n.params.contains("shift")) << n.name;
        ++count;
      }
    return count;
  };
  const int64_t first = binarizers();
  EXPECT_EQ(first, 3);  // conv2's, fc1's and fc2's inputs
  c.weight_bits = 1;
  const q::Report second = q::apply(g, c);
  EXPECT_EQ(second.quantized.size(), 3u) << second.summary();
  EXPECT_TRUE(second.inserted.empty()) << second.summary();
  EXPECT_EQ(binarizers(), first);
  GraphModule m(g);
  const at::Tensor y = m->forward(at::randn({2, 1, 28, 28}));
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{2, 10}));
}

// EDE over the run: t from ede_t_min at the start (epoch 0 < 1 whole epoch done) to ede_t_max once
// the span is done, changed once a whole epoch, on the binarized layers and their binarizers alike
// (IR-Net's schedule: its last epoch trains at t_min·(t_max/t_min)^((N − 1)/N)).
TEST(Ede, ScheduledOverTheRun) {
  q::register_all();
  Graph g = build_model("resnet20");
  q::Config c;
  c.method = "xnor";
  c.options["sign_gradient"] = std::string("ede");
  c.schedule_start_epoch = 0;
  c.schedule_end_epoch = 10;
  const q::Config resolved = q::resolve(c);
  q::apply(g, resolved);
  const std::string layer = q::quantized_by(g, resolved).front();
  EXPECT_NEAR(g.node(layer).attr_float("ede_t"), 0.1, 1e-12);
  EXPECT_EQ(q::at_epoch(g, resolved, 0.7), 0);  // still t_min
  EXPECT_EQ(q::at_epoch(g, resolved, 5.2), 38);  // 20 layers and their 18 binarizers
  EXPECT_NEAR(g.node(layer).attr_float("ede_t"), 1.0, 1e-12);
  EXPECT_EQ(q::at_epoch(g, resolved, 5.9), 0);
  q::at_epoch(g, resolved, 10.0);
  EXPECT_NEAR(g.node(layer).attr_float("ede_t"), 10.0, 1e-12);
  for (const Node& n : g.nodes())
    if (n.op == "act_quant") {
      EXPECT_NEAR(n.attr_float("ede_t"), 10.0, 1e-12) << n.name;
    }
  // Bad schedules are named.
  c.options["ede_t_min"] = 0.0;
  EXPECT_THROW(q::resolve(c), Error);
}

}  // namespace
}  // namespace whittle::test
