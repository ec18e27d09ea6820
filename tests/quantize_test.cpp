// Quantizers (values and straight-through gradients worked out by hand in the comments), and the
// quantize pass on graphs: wiring, first/last layers, binary activations, residual models.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "quantize/quantize.h"
#include "quantize/quantizers.h"
#include "support.h"

namespace whittle::test {
namespace {

namespace q = whittle::quantize;

at::Tensor vec(std::vector<float> v, const at::Device& device = at::kCPU) {
  return at::tensor(v, at::TensorOptions().dtype(at::kFloat)).to(device);
}

// Runs f(x) with x requiring grad and upstream gradient ones; returns (output, x.grad).
template <class F>
std::pair<at::Tensor, at::Tensor> forward_backward(at::Tensor x, F f) {
  x = x.detach().clone().set_requires_grad(true);
  at::Tensor y = f(x);
  y.backward(at::ones_like(y));
  return {y.detach(), x.grad()};
}

class QuantizerTest : public SeededTest, public ::testing::WithParamInterface<std::string> {
 protected:
  at::Device device() const { return at::Device(GetParam()); }
  void SetUp() override {
    SeededTest::SetUp();
    if (GetParam() == "cuda" && !at::hasCUDA()) GTEST_SKIP() << "no CUDA device available";
  }
};

// Float32 grid points: 1/6·3 and 5/6·3 round to exactly 0.5 and 2.5, the ties that half-to-even
// sends to 0 and 2 (half-away-from-zero would give 1 and 3).
TEST_P(QuantizerTest, QuantizeKRoundsHalfToEven) {
  at::Tensor r = vec({1.0f / 6, 0.5f, 5.0f / 6}, device());
  EXPECT_TRUE(all_close(q::quantize_k(r, 2), vec({0, 2.0f / 3, 2.0f / 3}), 1e-7, 0));
}

// x = [−0.3, 0.2, 0.5, 0.9, 1.7]: clip → [0, .2, .5, .9, 1], ·3 → [0, .6, 1.5, 2.7, 3],
// round → [0, 1, 2, 3, 3] (1.5 → 2 half-to-even), /3; gradient 1 inside [0, 1] only.
TEST_P(QuantizerTest, DoReFaActivation2Bit) {
  auto [y, g] = forward_backward(vec({-0.3f, 0.2f, 0.5f, 0.9f, 1.7f}, device()),
                                 [](const at::Tensor& x) { return q::dorefa_activation(x, 2); });
  EXPECT_TRUE(all_close(y, vec({0, 1.0f / 3, 2.0f / 3, 1, 1}), 1e-7, 0));
  EXPECT_TRUE(all_close(g, vec({0, 1, 1, 1, 0}), 0, 0));
  at::Tensor x = vec({-0.3f, 0.7f});
  EXPECT_TRUE(q::dorefa_activation(x, 32).equal(x));
}

// Clip level 2, 2 bits: levels 0, 2/3, 4/3, 2. x = [−0.3, 0.2, 0.5, 1.0, 1.9, 2.5]: clip → [0, .2,
// .5, 1, 1.9, 2], /2·3 → [0, .3, .75, 1.5, 2.85, 3], round → [0, 0, 1, 2, 3, 3] (1.5 → 2), ·2/3 →
// [0, 0, 2/3, 4/3, 2, 2]; gradient 1 inside [0, 2] only (1.9 passes, 2.5 and −0.3 do not).
TEST_P(QuantizerTest, DoReFaActivationClipLevel) {
  auto [y, g] = forward_backward(vec({-0.3f, 0.2f, 0.5f, 1.0f, 1.9f, 2.5f}, device()),
                                 [](const at::Tensor& x) { return q::dorefa_activation(x, 2, 2.0); });
  EXPECT_TRUE(all_close(y, vec({0, 0, 2.0f / 3, 4.0f / 3, 2, 2}), 1e-6, 0));
  EXPECT_TRUE(all_close(g, vec({0, 1, 1, 1, 1, 0}), 0, 0));
  // Clip level 1 is the paper's quantizer, bitwise; 0, negative and non-finite levels are errors.
  at::Tensor x = at::randn({1000}, at::TensorOptions().device(device()));
  EXPECT_TRUE(q::dorefa_activation(x, 4, 1.0).equal(at::round(x.clamp(0, 1) * 15) / 15));
  EXPECT_THROW(q::dorefa_activation(x, 4, 0.0), Error);
  EXPECT_THROW(q::dorefa_activation(x, 4, -1.0), Error);
  EXPECT_THROW(q::dorefa_activation(x, 4, std::nan("")), Error);
}

// w = [−2, −0.5, 0, 0.3, 1]: M = tanh 2 = 0.964028; w' = tanh(w)/(2M) + 1/2 =
// [0, 0.26028, 0.5, 0.65110, 0.89500]; ·3 → [0, 0.781, 1.5, 1.953, 2.685] → [0, 1, 2, 2, 3];
// w_q = 2q − 1 = [−1, −1/3, 1/3, 1/3, 1]. Gradient at 0.3: (1 − tanh²0.3)/M = 0.915137/0.964028 = 0.94929.
TEST_P(QuantizerTest, DoReFaWeight2Bit) {
  auto [y, g] = forward_backward(vec({-2, -0.5f, 0, 0.3f, 1}, device()),
                                 [](const at::Tensor& w) { return q::dorefa_weight(w, 2); });
  EXPECT_TRUE(all_close(y, vec({-1, -1.0f / 3, 1.0f / 3, 1.0f / 3, 1}), 1e-6, 0));
  EXPECT_NEAR(g[3].item<double>(), 0.94929, 1e-5);
  const double m = std::tanh(2.0);
  EXPECT_NEAR(g[0].item<double>(), (1 - std::pow(std::tanh(2.0), 2)) / m, 1e-6);
}

// w = [1.66, −1.63, 1.36, 0.84]: tanh = [.93034, −.92631, .87653, .68565], M = .93034; ·15 codes
// [15, 0, 15, 13] → [1, −1, 1, 11/15 = 0.7333]. Again: tanh = [.76159, −.76159, .76159, .62538],
// codes [15, 0, 15, 14] → [1, −1, 1, 13/15 = 0.8667]: DoReFa is not idempotent.
TEST_P(QuantizerTest, DoReFaWeight4BitIsNotIdempotent) {
  at::Tensor once = q::dorefa_weight(vec({1.66f, -1.63f, 1.36f, 0.84f}, device()), 4);
  EXPECT_TRUE(all_close(once, vec({1, -1, 1, 11.0f / 15}), 1e-6, 0));
  at::Tensor twice = q::dorefa_weight(once, 4);
  EXPECT_TRUE(all_close(twice, vec({1, -1, 1, 13.0f / 15}), 1e-6, 0));
}

// k = 1: sign(w)·mean|w| = ±(0.5+1+0+2)/4 = ±0.875, sign(0) = +1; gradient straight through.
TEST_P(QuantizerTest, DoReFaWeight1BitAnd32Bit) {
  auto [y, g] = forward_backward(vec({0.5f, -1, 0, 2}, device()), [](const at::Tensor& w) { return q::dorefa_weight(w, 1); });
  EXPECT_TRUE(all_close(y, vec({0.875f, -0.875f, 0.875f, 0.875f}), 1e-7, 0));
  EXPECT_TRUE(all_close(g, vec({1, 1, 1, 1}), 0, 0));
  at::Tensor w = vec({0.3f, -7});
  EXPECT_TRUE(q::dorefa_weight(w, 32).equal(w));
  EXPECT_THROW(q::dorefa_weight(w, 9), Error);
  EXPECT_THROW(q::dorefa_activation(w, 0), Error);
}

// sign(0) = sign(−0) = +1: a binary value is never 0. Gradient 1 where |x| ≤ 1.
TEST_P(QuantizerTest, BnnSign) {
  at::Tensor y = q::bnn_sign(vec({-1.5f, -0.0f, 0.0f, 1e-8f, 2.0f}, device()));
  EXPECT_TRUE(all_close(y, vec({-1, 1, 1, 1, 1}), 0, 0));
  auto [y2, g] = forward_backward(vec({-2, -0.5f, 0, 0.5f, 2}, device()), [](const at::Tensor& x) { return q::bnn_sign(x); });
  EXPECT_TRUE(all_close(g, vec({0, 1, 1, 1, 0}), 0, 0));
}

// W = [0.5, −2, 0.1, 1.5] (one output channel): α = 4.1/4 = 1.025. With upstream ones,
// d/dW_i Σ_j α·s_j = α·[|W_i| ≤ 1] + (Σ_j s_j)·sign(W_i)/4 = α·mask + 2·sign/4:
// [1.025 + 0.5, −0.5, 1.025 + 0.5, 0.5]; with α detached only α·mask = [1.025, 0, 1.025, 0].
TEST_P(QuantizerTest, XnorWeight) {
  at::Tensor w = vec({0.5f, -2, 0.1f, 1.5f}, device()).reshape({1, 4});
  auto [y, g] = forward_backward(w, [](const at::Tensor& x) { return q::xnor_weight(x); });
  EXPECT_TRUE(all_close(y, vec({1.025f, -1.025f, 1.025f, 1.025f}).reshape({1, 4}), 1e-6, 0));
  EXPECT_TRUE(all_close(g, vec({1.525f, -0.5f, 1.525f, 0.5f}).reshape({1, 4}), 1e-6, 0));
  auto [y2, g2] = forward_backward(w, [](const at::Tensor& x) { return q::xnor_weight(x, /*detach_alpha=*/true); });
  EXPECT_TRUE(all_close(y2, y, 0, 0));
  EXPECT_TRUE(all_close(g2, vec({1.025f, 0, 1.025f, 0}).reshape({1, 4}), 1e-6, 0));
}

// Per output channel: α_c = mean|W_c| = [1, 3].
TEST_P(QuantizerTest, XnorWeightPerChannel) {
  at::Tensor w = vec({1, -1, -2, 4}, device()).reshape({2, 2});
  EXPECT_TRUE(all_close(q::xnor_weight(w), vec({1, -1, -3, 3}).reshape({2, 2}), 1e-6, 0));
  EXPECT_TRUE(all_close(q::xnor_weight(w, false, q::Granularity::kPerTensor), vec({2, -2, -2, 2}).reshape({2, 2}), 1e-6, 0));
}

// W = [0.9, −0.05, 0.3, −1.2, 0, 0.02]: mean|W| = 2.47/6, Δ = 0.7·0.411667 = 0.288167;
// |W| > Δ: 0.9, 0.3, 1.2 → α = 2.4/3 = 0.8. Gradient straight through.
TEST_P(QuantizerTest, TwnPerTensor) {
  at::Tensor w = vec({0.9f, -0.05f, 0.3f, -1.2f, 0, 0.02f}, device());
  q::TwnThreshold th = q::twn_threshold(w, q::Granularity::kPerTensor);
  EXPECT_NEAR(th.delta.item<double>(), 0.288167, 1e-6);
  EXPECT_NEAR(th.alpha.item<double>(), 0.8, 1e-6);
  auto [y, g] = forward_backward(w, [](const at::Tensor& x) { return q::twn_weight(x, q::Granularity::kPerTensor); });
  EXPECT_TRUE(all_close(y, vec({0.8f, 0, 0.8f, -0.8f, 0, 0}), 1e-6, 0));
  EXPECT_TRUE(all_close(g, at::ones({6}), 0, 0));
}

TEST_P(QuantizerTest, TwnAllZero) {
  at::Tensor w = at::zeros({3, 4}, at::TensorOptions().device(device()));
  q::TwnThreshold th = q::twn_threshold(w);
  EXPECT_TRUE(all_close(th.alpha, at::zeros({3}), 0, 0));
  auto [y, g] = forward_backward(w, [](const at::Tensor& x) { return q::twn_weight(x); });
  EXPECT_TRUE(all_close(y, at::zeros({3, 4}), 0, 0));
  EXPECT_TRUE(g.isfinite().all().item<bool>());
}

// DoReFa weights in float16 and bfloat16 (issue 47, item 13): all-zero and tiny weights give finite
// values and gradients at 2, 4 and 8 bits (the max's floor 1e-12 rounds to 0 in float16, which
// divided 0 by 0), and ordinary weights the float32 grid within 8e-3 (two bfloat16 steps at 1;
// measured worst 3.9e-3, bfloat16 at 8 bits: the margin is for other instruction sets).
TEST_P(QuantizerTest, DoReFaWeightInHalfPrecisions) {
  for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    const auto o = at::TensorOptions().dtype(dtype).device(device());
    for (const int64_t bits : {2, 4, 8}) {
      for (const double v : {0.0, 1e-8}) {
        auto [y, g] = forward_backward(at::full({3, 4}, v, o), [&](const at::Tensor& x) { return q::dorefa_weight(x, bits); });
        EXPECT_TRUE(y.isfinite().all().item<bool>()) << dtype << " " << bits << " bits, weights " << v << ": " << y;
        EXPECT_TRUE(g.isfinite().all().item<bool>()) << dtype << " " << bits << " bits, weights " << v << ": " << g;
      }
      const at::Tensor w = vec({-1.0f, -0.25f, 0.0f, 0.5f, 2.0f}, device());
      const at::Tensor want = q::dorefa_weight(w, bits);
      const at::Tensor got = q::dorefa_weight(w.to(dtype), bits).to(at::kFloat);
      EXPECT_TRUE(all_close(got, want, 8e-3, 0)) << dtype << " " << bits << " bits: " << got << " vs " << want;
    }
  }
}

// Per channel (rows): row 0 as the per-tensor case, row 1 = [2, −2, 0.1, 0, 0, 0]: mean|W| = 0.683,
// Δ = 0.478, α = 2.
TEST_P(QuantizerTest, TwnPerChannel) {
  at::Tensor w = vec({0.9f, -0.05f, 0.3f, -1.2f, 0, 0.02f, 2, -2, 0.1f, 0, 0, 0}, device()).reshape({2, 6});
  at::Tensor y = q::twn_weight(w);
  EXPECT_TRUE(all_close(y, vec({0.8f, 0, 0.8f, -0.8f, 0, 0, 2, -2, 0, 0, 0, 0}).reshape({2, 6}), 1e-6, 0));
}

// The encoders' codes decode to exactly the quantizers' outputs.
TEST_P(QuantizerTest, EncodeDecodeIsTheForward) {
  at::Tensor w = at::randn({8, 3, 3, 3}).to(device());
  for (int64_t k : {1, 2, 3, 4, 8}) {
    q::EncodedWeight e = q::dorefa_encode(w, k);
    EXPECT_TRUE(q::decode_weight(e.codes, e.scale, e.encoding, e.bits, e.axis, at::kFloat).equal(q::dorefa_weight(w, k))) << k;
  }
  q::EncodedWeight t = q::twn_encode(w);
  EXPECT_TRUE(q::decode_weight(t.codes, t.scale, t.encoding, t.bits, 0, at::kFloat).equal(q::twn_weight(w)));
  q::EncodedWeight x = q::xnor_encode(w);
  EXPECT_TRUE(q::decode_weight(x.codes, x.scale, x.encoding, x.bits, 0, at::kFloat).equal(q::xnor_weight(w)));
  q::EncodedWeight b = q::bnn_encode(w);
  EXPECT_TRUE(q::decode_weight(b.codes, b.scale, b.encoding, b.bits, 0, at::kFloat).equal(q::bnn_sign(w)));
}

INSTANTIATE_TEST_SUITE_P(Devices, QuantizerTest, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ---------------------------------------------------------------- the pass

Node layer(const std::string& name, const std::string& op, const std::string& input, at::Tensor weight) {
  Node n;
  n.name = name;
  n.op = op;
  n.inputs = {input};
  n.params.set("weight", weight.set_requires_grad(true));
  return n;
}

// stem conv(1→1, 1×1) → identity → the op under test (weight 1) → identity → classifier linear.
// The middle layer is the only one the pass quantizes (first and last stay full precision).
Graph wiring_graph(const std::string& op) {
  Graph g;
  g.add_input("x", {1, 1, 1, 1});
  g.add_node(layer("stem", "conv2d", "x", at::ones({1, 1, 1, 1})));
  g.add_node(Node{"id", "identity", {"stem"}, {}, {}, {}, {}});
  at::Tensor w = op == "linear" ? at::ones({1, 1}) : at::ones({1, 1, 1, 1});
  std::string in = "id";
  if (op == "linear") in = g.add_node(Node{"flat", "flatten", {"id"}, {}, {}, {}, {}});
  g.add_node(layer("mid", op, in, w));
  std::string out = "mid";
  if (op != "linear") out = g.add_node(Node{"flat2", "flatten", {"mid"}, {}, {}, {}, {}});
  g.add_node(layer("head", "linear", out, at::ones({1, 1})));
  g.set_outputs({"head"});
  return g;
}

// 0.4 → 2-bit activation round(0.4·3)/3 = 1/3, through a full-precision layer of weight 1.
TEST(QuantizePass, QuantizedActivationIsWhatTheLayerUses) {
  for (const std::string op : {"conv2d", "conv_transpose2d", "linear"}) {
    GraphModule m(wiring_graph(op));
    q::Config c;
    c.method = "dorefa";
    c.weight_bits = 32;
    c.activation_bits = 2;
    q::Report r = q::apply(m, c);
    ASSERT_EQ(r.quantized, std::vector<std::string>{"mid"}) << op;
    ASSERT_EQ(r.inserted, std::vector<std::string>{"mid.act_quant"}) << op;
    m->eval();
    at::Tensor y = m->forward(at::full({1, 1, 1, 1}, 0.4f));
    EXPECT_NEAR(y.item<double>(), 1.0 / 3, 1e-7) << op;
  }
}

// A grouped transposed convolution's weight [C_in, C_out/groups, kh, kw] holds C_out/groups on its
// output axis: per-channel scales there would serve output channels 0 and 2 of a ConvTranspose2d(6 →
// 4, groups 2) with one scale. Such a layer is skipped, saying so, unless per-tensor scales are asked
// for; an ungrouped one keeps its per-channel scales.
TEST(QuantizePass, GroupedTransposedConvolutionRefusesPerChannelScales) {
  auto graph = [](int64_t groups) {
    Graph g;
    g.add_input("x", {1, 6, 3, 3});
    g.add_node(layer("stem", "conv2d", "x", at::randn({6, 6, 1, 1})));
    Node up = layer("up", "conv_transpose2d", "stem", at::randn({6, 4 / groups, 2, 2}));
    up.attrs["groups"] = groups;
    g.add_node(up);
    g.add_node(layer("head", "conv2d", "up", at::randn({2, 4, 1, 1})));
    g.set_outputs({"head"});
    return g;
  };
  for (const std::string method : {"twn", "xnor", "dorefa"}) {
    q::Config c;
    c.method = method;
    c.weight_bits = method == "twn" ? 2 : method == "xnor" ? 1 : 4;
    c.activation_bits = 32;
    if (method == "xnor") c.activation_bits = 1;
    if (method == "dorefa") c.options["granularity"] = "per_channel";
    Graph g = graph(2);
    const q::Report r = q::select_layers(g, c);
    EXPECT_TRUE(r.quantized.empty()) << method;
    ASSERT_EQ(r.skipped.size(), 3u) << method;  // stem and head: first and last
    EXPECT_EQ(r.skipped[1],
              "up: a grouped transposed convolution (groups 2) cannot have one scale per output channel; quantize it "
              "with granularity per_tensor")
        << method;
    c.options["granularity"] = "per_tensor";
    EXPECT_EQ(q::apply(g, c).quantized, std::vector<std::string>{"up"}) << method;
    Graph ungrouped = graph(1);
    c.options["granularity"] = "per_channel";
    EXPECT_EQ(q::apply(ungrouped, c).quantized, std::vector<std::string>{"up"}) << method;
  }
}

// activation_clip 2: 0.9 → 2-bit level round(0.9/2·3)·2/3 = round(1.35)·2/3 = 2/3; the level is an
// attribute of the act_quant node only when it is not 1. It is refused for binary activations.
TEST(QuantizePass, ActivationClipReachesTheQuantizer) {
  GraphModule m(wiring_graph("linear"));
  q::Config c;
  c.method = "dorefa";
  c.weight_bits = 32;
  c.activation_bits = 2;
  c.options["activation_clip"] = 2.0;
  q::apply(m, c);
  EXPECT_DOUBLE_EQ(m->graph().node("mid.act_quant").attr_float("activation_clip"), 2.0);
  m->eval();
  EXPECT_NEAR(m->forward(at::full({1, 1, 1, 1}, 0.9f)).item<double>(), 2.0 / 3, 1e-6);
  GraphModule plain(wiring_graph("linear"));
  c.options["activation_clip"] = 1.0;
  q::apply(plain, c);
  EXPECT_FALSE(plain->graph().node("mid.act_quant").has_attr("activation_clip"));
  Graph g = build_model("lenet5");
  c.method = "xnor";
  c.weight_bits = 0;
  c.activation_bits = 0;
  c.options["activation_clip"] = 2.0;
  EXPECT_THROW(q::apply(g, c), Error);
  c.method = "dorefa";
  c.options["activation_clip"] = 0.0;
  EXPECT_THROW(q::apply(g, c), Error);
}

TEST(QuantizePass, FirstAndLastStayFullPrecisionUnlessNamed) {
  Graph g = build_model("lenet5");
  q::Config c;
  c.method = "dorefa";
  c.weight_bits = 4;
  c.activation_bits = 4;
  Graph a = g.clone();
  q::Report r = q::apply(a, c);
  EXPECT_EQ(r.quantized, (std::vector<std::string>{"conv2", "fc1", "fc2"}));
  EXPECT_TRUE(a.node("conv1").weight_transforms.empty());
  EXPECT_TRUE(a.node("fc3").weight_transforms.empty());
  EXPECT_EQ(a.node("conv2").weight_transforms, std::vector<std::string>{"dorefa"});
  EXPECT_EQ(a.node("conv2").attr_int("weight_bits"), 4);
  EXPECT_EQ(a.node("conv2").inputs[0], "conv2.act_quant");

  Graph b = g.clone();
  c.targets = {"conv1", "conv2d", "fc3"};
  r = q::apply(b, c);
  EXPECT_EQ(r.quantized, (std::vector<std::string>{"conv1", "conv2", "fc3"}));
  // Applying again changes nothing.
  q::Report again = q::apply(b, c);
  EXPECT_TRUE(again.quantized.empty());
  EXPECT_EQ(again.skipped.size(), 3u);
}

TEST(QuantizePass, BadConfigNamesTheKey) {
  Graph g = build_model("lenet5");
  q::Config c;
  c.method = "bnn";
  c.weight_bits = 4;
  try {
    q::apply(g, c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_bits"), std::string::npos) << e.what();
  }
  c.method = "ternary";
  EXPECT_THROW(q::apply(g, c), Error);
}

// BNN on LeNet-5: the ReLUs feeding conv2 (through pool1), fc1 (through pool2, flatten) and fc2
// become sign binarizers; relu4 feeds the full-precision classifier and stays.
TEST(QuantizePass, BinaryActivationsReplaceTheRelu) {
  GraphModule m(build_model("lenet5"));
  q::Config c;
  c.method = "bnn";
  q::Report r = q::apply(m, c);
  EXPECT_EQ(r.replaced, (std::vector<std::string>{"relu1", "relu2", "relu3"}));
  EXPECT_TRUE(r.inserted.empty());
  EXPECT_EQ(m->graph().node("relu4").op, "relu");
  m->train();
  std::map<std::string, at::Tensor> cap;
  at::Tensor x = at::randn({4, 1, 28, 28});
  m->forward_with_intermediates({x}, {"pool1", "relu3"}, &cap);
  EXPECT_TRUE(cap["pool1"].abs().eq(1).all().item<bool>());
  EXPECT_TRUE(cap["relu3"].abs().eq(1).all().item<bool>());
  // Gradients reach the latent weights through the STEs.
  at::Tensor y = m->forward(x);
  y.sum().backward();
  EXPECT_TRUE(m->graph().node("conv2").params.at("weight").grad().abs().sum().item<double>() > 0);
  // Clipping the latent weights.
  {
    at::NoGradGuard ng;
    m->graph().node("fc1").params.at("weight").mul_(10);
  }
  EXPECT_EQ(q::after_step(m->graph(), q::resolve(c)), 3);
  EXPECT_LE(m->graph().node("fc1").params.at("weight").abs().max().item<double>(), 1.0);
}

// ResNet-20 with XNOR: the stem ReLU also feeds the residual add, so it stays and layer1.0.conv1
// reads sign(bn1); ReLUs feeding only binarized convs become binarizers; the model trains.
TEST(QuantizePass, ResidualModelXnorWithK) {
  GraphModule m(build_model("resnet20"));
  q::Config c;
  c.method = "xnor";
  c.options["xnor_scale_k"] = true;
  q::Report r = q::apply(m, c);
  EXPECT_EQ(m->graph().node("relu").op, "relu");
  EXPECT_EQ(m->graph().node("layer1.0.conv1.act_quant").inputs[0], "bn1");
  EXPECT_EQ(m->graph().node("layer1.0.relu1").op, "act_quant");
  EXPECT_EQ(r.quantized.size(), 20u);  // 21 convs (incl. 2 shortcuts) + fc, minus stem and fc
  EXPECT_NE(m->graph().find_node("layer1.0.conv2.xnor_mul"), nullptr);
  m->train();
  at::Tensor y = m->forward(at::randn({2, 3, 32, 32}));
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{2, 10}));
  y.sum().backward();
  EXPECT_TRUE(m->graph().node("layer2.0.shortcut.0").params.at("weight").grad().defined());
}

// Concatenations (NIN has none; a small branchy graph): the quantizer sits in front of the layer
// that reads the concatenation.
TEST(QuantizePass, Concatenation) {
  Graph g;
  g.add_input("x", {1, 3, 8, 8});
  g.add_node(layer("stem", "conv2d", "x", at::randn({4, 3, 1, 1})));
  g.add_node(Node{"r", "relu", {"stem"}, {}, {}, {}, {}});
  g.add_node(layer("a", "conv2d", "r", at::randn({4, 4, 1, 1})));
  g.add_node(layer("b", "conv2d", "r", at::randn({4, 4, 1, 1})));
  g.add_node(Node{"cat", "cat", {"a", "b"}, {}, {}, {}, {}});
  g.add_node(layer("c", "conv2d", "cat", at::randn({4, 8, 1, 1})));
  g.add_node(Node{"flat", "flatten", {"c"}, {}, {}, {}, {}});
  g.add_node(layer("fc", "linear", "flat", at::randn({2, 256})));
  g.set_outputs({"fc"});
  q::Config cfg;
  cfg.method = "dorefa";
  cfg.weight_bits = 2;
  cfg.activation_bits = 2;
  q::Report r = q::apply(g, cfg);
  EXPECT_EQ(r.quantized, (std::vector<std::string>{"a", "b", "c"}));
  // r feeds only the quantized a and b: it becomes their shared quantizer (relu = 1).
  EXPECT_EQ(r.replaced, (std::vector<std::string>{"r"}));
  EXPECT_EQ(r.inserted, (std::vector<std::string>{"c.act_quant"}));
  // A DoReFa quantizer is no binarizer: the summary names what the ReLU became.
  EXPECT_NE(r.summary().find("ReLU replaced by its activation quantizer: r\n"), std::string::npos) << r.summary();
  EXPECT_EQ(g.node("r").op, "act_quant");
  EXPECT_EQ(g.node("a").inputs[0], "r");
  EXPECT_EQ(g.node("b").inputs[0], "r");
  EXPECT_EQ(g.node("c.act_quant").inputs[0], "cat");
  GraphModule m(g);
  EXPECT_EQ(m->forward(at::randn({2, 3, 8, 8})).sizes(), (at::IntArrayRef{2, 2}));
}

// DoReFa W4A4 on ResNet-20: each in-block ReLU feeds only the quantized conv2 of its block and
// becomes the quantizer (act_quant with relu = 1), as do the outputs of layer1.2 and layer2.2,
// which feed only the next stage's quantized conv1 and 1×1 shortcut conv; the stem and the other
// block-output ReLUs also feed a residual add (layer3.2's the pooled classifier) and keep an
// act_quant after them. The folded graph computes bit for bit the outputs and gradients of the
// unfolded one (ReLU node, then act_quant), rebuilt here from it.
TEST(QuantizePass, DoReFaFoldsAReluWhoseUsesAreAllQuantized) {
  GraphModule folded(build_model("resnet20"));
  q::Config c;
  c.method = "dorefa";
  c.weight_bits = 4;
  c.activation_bits = 4;
  c.options["activation_clip"] = 2.0;
  q::Report r = q::apply(folded, c);
  std::vector<std::string> expected;
  for (int stage = 1; stage <= 3; ++stage)
    for (int block = 0; block < 3; ++block) {
      const std::string p = "layer" + std::to_string(stage) + "." + std::to_string(block);
      expected.push_back(p + ".relu1");
      if (block == 2 && stage < 3) expected.push_back(p + ".relu2");
    }
  EXPECT_EQ(r.replaced, expected);
  EXPECT_EQ(r.inserted.size(), 7u);  // after the stem ReLU and six block outputs that feed an add
  EXPECT_EQ(folded->graph().node("layer2.0.conv1").inputs[0], "layer1.2.relu2");
  EXPECT_EQ(folded->graph().node("layer2.0.shortcut.0").inputs[0], "layer1.2.relu2");
  const Node& relu1 = folded->graph().node("layer1.0.relu1");
  EXPECT_EQ(relu1.op, "act_quant");
  EXPECT_EQ(relu1.attr_int("relu"), 1);
  EXPECT_DOUBLE_EQ(relu1.attr_float("activation_clip"), 2.0);
  EXPECT_EQ(folded->graph().node("relu").op, "relu");  // the stem's feeds layer1.0's residual add

  // The unfolded graph: each relu = 1 quantizer back to a ReLU followed by a plain act_quant.
  Graph g = folded->graph().clone();  // own tensors, equal values
  for (const auto& name : r.replaced) {
    Node& n = g.node(name);
    const std::vector<std::string> users = g.users(name);
    n.op = "relu";
    n.attrs.clear();
    for (const auto& u : users) {
      Node aq;
      aq.name = g.unique_name(u + ".act_quant");
      aq.op = "act_quant";
      aq.inputs = {name};
      aq.attrs = {{"method", std::string("dorefa")}, {"activation_bits", int64_t{4}}, {"activation_clip", 2.0}};
      const std::string out = g.insert_node_before(u, aq);
      g.node(u).inputs[0] = out;
    }
  }
  GraphModule unfolded(std::move(g));
  at::manual_seed(3);
  at::Tensor x = at::randn({4, 3, 32, 32});
  folded->train();
  unfolded->train();
  at::Tensor y_folded = folded->forward(x), y_unfolded = unfolded->forward(x);
  EXPECT_TRUE(y_folded.equal(y_unfolded));
  y_folded.sum().backward();
  y_unfolded.sum().backward();
  auto a = folded->named_parameters(), b = unfolded->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& kv : a) {
    ASSERT_FALSE(kv.value().is_same(b[kv.key()])) << kv.key();
    EXPECT_TRUE(kv.value().grad().equal(b[kv.key()].grad())) << kv.key();
  }
}

// A ReLU with a use that is not a quantized layer stays a ReLU (here: the graph output).
TEST(QuantizePass, DoReFaKeepsAReluWithOtherUses) {
  Graph g;
  g.add_input("x", {2, 4});
  g.add_node(layer("fc1", "linear", "x", at::randn({4, 4})));
  g.add_node(Node{"act", "relu", {"fc1"}, {}, {}, {}, {}});
  g.add_node(layer("fc2", "linear", "act", at::randn({4, 4})));
  g.add_node(layer("fc3", "linear", "fc2", at::randn({2, 4})));
  g.set_outputs({"fc3", "act"});
  q::Config c;
  c.method = "dorefa";
  c.weight_bits = 4;
  c.activation_bits = 4;
  q::Report r = q::apply(g, c);
  EXPECT_TRUE(r.replaced.empty());
  EXPECT_EQ(r.inserted, std::vector<std::string>{"fc2.act_quant"});
  EXPECT_EQ(g.node("act").op, "relu");
}

TEST(QuantizePass, CudaForwardBackward) {
  WHITTLE_REQUIRE_CUDA();
  for (const std::string method : {"dorefa", "twn", "bnn", "xnor", "lsq", "pact"}) {
    GraphModule m(build_model("resnet20"));
    q::Config c;
    c.method = method;
    q::apply(m, c);
    m->to(at::kCUDA);
    m->train();
    at::Tensor y = m->forward(at::randn({2, 3, 32, 32}, at::kCUDA));
    y.sum().backward();
    EXPECT_TRUE(y.isfinite().all().item<bool>()) << method;
  }
}

}  // namespace
}  // namespace whittle::test
