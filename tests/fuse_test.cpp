// Fusion passes (fuse/): the folding arithmetic with hand-worked values, fuses / does-not-fuse
// pairs, fused-versus-unfused outputs on the zoo models and an imported torchvision ResNet-18,
// BN → threshold on BNN / XNOR LeNet-5, RepVGG merging, and BN folding during QAT.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <cmath>

#include "data/load.h"
#include "data/transforms.h"
#include "export/checkpoint.h"
#include "fuse/fold_math.h"
#include "fuse/fuse.h"
#include "core/error.h"
#include "core/file_util.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "graph/zoo.h"
#include "quantize/lsq.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "runner/modifier.h"
#include "runner/recipe.h"
#include "runner/trainer.h"
#include "fuse_test_util.h"
#include "graph/serialize.h"
#include "support.h"
#include "test_models.h"

namespace whittle::test {
namespace {

namespace f = whittle::fuse;

using FoldMath = SeededTest;
using FoldPass = SeededTest;
using Threshold = SeededTest;
using Repvgg = SeededTest;
using QatFold = SeededTest;

using test::make;

at::Tensor vec(std::vector<float> v) { return at::tensor(v); }

// A batch_norm node over C channels with the given statistics (eps 0 unless given).
Node bn_node(const std::string& name, const std::string& input, at::Tensor gamma, at::Tensor beta, at::Tensor mean,
             at::Tensor var, double eps) {
  Node bn = make(name, "batch_norm", {input}, {{"eps", eps}});
  if (gamma.defined()) bn.params.set("weight", gamma.set_requires_grad(true));
  if (beta.defined()) bn.params.set("bias", beta.set_requires_grad(true));
  bn.buffers.set("running_mean", mean);
  bn.buffers.set("running_var", var);
  bn.buffers.set("num_batches_tracked", at::zeros({}, at::kLong));
  return bn;
}

// ---------------------------------------------------------------- the folding arithmetic

TEST_F(FoldMath, HandWorkedConvBn) {
  // 1×1 conv, weight 2, bias 1; BN γ = 3, β = 0.5, μ = 4, σ² = 0.25, ε = 0:
  // s = 3/√0.25 = 6, W' = 12, b' = 0.5 + (1 − 4)·6 = −17.5; x = 1 → 12 − 17.5 = −5.5.
  f::ConvBnParams p;
  p.weight = at::full({1, 1, 1, 1}, 2.0);
  p.bias = vec({1});
  p.bn = {vec({4}), vec({0.25f}), vec({3}), vec({0.5f}), 0.0};
  f::FoldedParams r = f::fold_conv_bn_params(p);
  EXPECT_FLOAT_EQ(r.weight.item<float>(), 12.0f);
  EXPECT_FLOAT_EQ(r.bias.item<float>(), -17.5f);
  EXPECT_EQ(r.weight.scalar_type(), at::kFloat);
  EXPECT_FALSE(r.weight.requires_grad());
}

TEST_F(FoldMath, EpsilonInsideTheRoot) {
  // γ = 1, σ² = 1e−4, ε = 1e−3: s = 1/√(1.1e−3) = 30.151 (not 1/(√1e−4 + 1e−3) = 90.9).
  // A channel with σ² = 0 gives 1/√ε = 31.623: finite.
  f::BatchNormParams bn{vec({0, 0}), vec({1e-4f, 0}), vec({1, 1}), vec({0, 0}), 1e-3};
  at::Tensor s = f::bn_scale(bn, /*high_precision=*/true);
  EXPECT_NEAR(s[0].item<double>(), 30.151134, 1e-5);
  EXPECT_NEAR(s[1].item<double>(), 31.622777, 1e-5);
  EXPECT_TRUE(at::isfinite(s).all().item<bool>());
}

TEST_F(FoldMath, AffineFalseMeansUnitGammaZeroBeta) {
  f::ConvBnParams p;
  p.weight = at::full({1, 2}, 2.0);
  p.bn = {vec({1}), vec({4}), at::Tensor(), at::Tensor(), 0.0};
  f::FoldedParams r = f::fold_conv_bn_params(p);
  EXPECT_TRUE(all_close(r.weight, at::full({1, 2}, 1.0), 0, 0));  // 2·1/2
  EXPECT_FLOAT_EQ(r.bias.item<float>(), -0.5f);                   // (0 − 1)·1/2
}

TEST_F(FoldMath, TransposedLayoutScalesAxisOnePerGroup) {
  // Weight [Cin = 4, Cout/g = 3, 1, 1] with groups = 2: output channel 3·g + j is column j of the
  // rows of group g, so row 2 (group 1) column 0 belongs to output channel 3.
  at::Tensor w = at::ones({4, 3, 1, 1});
  at::Tensor s = at::arange(1, 7, at::kFloat);  // channel c scaled by c + 1
  at::Tensor out = f::scale_output_channels(w, s, f::WeightLayout::kTransposed, 2);
  EXPECT_FLOAT_EQ(out[0][0][0][0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(out[1][2][0][0].item<float>(), 3.0f);
  EXPECT_FLOAT_EQ(out[2][0][0][0].item<float>(), 4.0f);
  EXPECT_FLOAT_EQ(out[3][2][0][0].item<float>(), 6.0f);
  EXPECT_THROW(f::scale_output_channels(w, at::ones({5}), f::WeightLayout::kTransposed, 2), Error);
}

TEST_F(FoldMath, IdentityKernelAndPadding) {
  // C = 4, groups = 2: 1 at [i, i mod 2, 1, 1].
  at::Tensor k = f::identity_kernel(4, 2, 3, 3, at::TensorOptions().dtype(at::kFloat));
  ASSERT_EQ(k.sizes(), (at::IntArrayRef{4, 2, 3, 3}));
  EXPECT_FLOAT_EQ(k.sum().item<float>(), 4.0f);
  for (int64_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(k[i][i % 2][1][1].item<float>(), 1.0f);
  at::Tensor p = f::pad_kernel(at::full({2, 1, 1, 1}, 5.0), 3, 3);
  EXPECT_FLOAT_EQ(p[1][0][1][1].item<float>(), 5.0f);
  EXPECT_FLOAT_EQ(p.sum().item<float>(), 10.0f);
  EXPECT_THROW(f::pad_kernel(at::ones({1, 1, 2, 2}), 3, 3), Error);
  EXPECT_THROW(f::identity_kernel(4, 3, 3, 3, at::TensorOptions()), Error);
}

// ---------------------------------------------------------------- BN folding on graphs

enum class Layer { kConv, kDepthwise, kConvNoBias, kLinear };

// One layer (weight 2, bias 1 unless kConvNoBias) + BN(γ 3, β 0.5, μ 4, σ² 0.25, ε 0) over C = 2
// identical channels, input all ones.
Graph hand_worked(Layer kind) {
  Graph g;
  const int64_t c = 2;
  Node l;
  if (kind == Layer::kLinear) {
    g.add_input("x", {1, c});
    l = make("fc", "linear", {"x"});
    l.params.set("weight", (at::eye(c) * 2).set_requires_grad(true));
  } else {
    g.add_input("x", {1, c, 1, 1});
    const bool dw = kind == Layer::kDepthwise;
    l = make("conv", "conv2d", {"x"}, dw ? std::map<std::string, Attr>{{"groups", c}} : std::map<std::string, Attr>{});
    at::Tensor w = dw ? at::full({c, 1, 1, 1}, 2.0) : (at::eye(c) * 2).reshape({c, c, 1, 1});
    l.params.set("weight", w.set_requires_grad(true));
  }
  if (kind != Layer::kConvNoBias) l.params.set("bias", at::ones({c}).set_requires_grad(true));
  const std::string out = g.add_node(l);
  g.add_node(bn_node("bn", out, at::full({c}, 3.0), at::full({c}, 0.5), at::full({c}, 4.0), at::full({c}, 0.25), 0.0));
  g.set_outputs({"bn"});
  return g;
}

class HandWorkedFold : public ::testing::TestWithParam<Layer> {};

TEST_P(HandWorkedFold, FusedLayerHasTheWorkedValues) {
  const Layer kind = GetParam();
  GraphModule m(hand_worked(kind));
  const at::Tensor x = kind == Layer::kLinear ? at::ones({1, 2}) : at::ones({1, 2, 1, 1});
  const at::Tensor before = run_eval(m, x);
  f::Report r = f::fold_batchnorm(m);
  ASSERT_EQ(r.fused.size(), 1u) << r.summary();
  EXPECT_EQ(count_op(m->graph(), "batch_norm"), 0);
  const Node& layer = m->graph().nodes().back();
  // With bias: W' = 12, b' = −17.5, output −5.5. Without: b' = 0.5 + (0 − 4)·6 = −23.5, output −11.5.
  const double bias = kind == Layer::kConvNoBias ? -23.5 : -17.5;
  const double y = kind == Layer::kConvNoBias ? -11.5 : -5.5;
  EXPECT_FLOAT_EQ(layer.params.at("weight").max().item<float>(), 12.0f);
  EXPECT_TRUE(all_close(layer.params.at("bias"), at::full({2}, bias), 0, 0));
  EXPECT_TRUE(layer.params.at("weight").requires_grad());
  EXPECT_TRUE(all_close(before, at::full_like(before, y), 1e-6, 0));
  EXPECT_TRUE(all_close(run_eval(m, x), before, 1e-6, 0));
}

INSTANTIATE_TEST_SUITE_P(Layers, HandWorkedFold,
                         ::testing::Values(Layer::kConv, Layer::kDepthwise, Layer::kConvNoBias, Layer::kLinear),
                         [](const ::testing::TestParamInfo<Layer>& info) {
                           switch (info.param) {
                             case Layer::kConv: return "Conv";
                             case Layer::kDepthwise: return "GroupsEqualChannels";
                             case Layer::kConvNoBias: return "ConvWithoutBias";
                             case Layer::kLinear: return "LinearBatchNorm1d";
                           }
                           return "unknown";
                         });

TEST_F(FoldPass, ConvTransposeWithDistinctGammas) {
  // ConvTranspose2d(3 → 5, k 3, stride 2) + BN(5), and a grouped one (4 → 6, groups 2, dilation 2).
  for (int64_t groups : {1, 2}) {
    const int64_t cin = groups == 1 ? 3 : 4, cout = groups == 1 ? 5 : 6;
    Graph g;
    g.add_input("x", {2, cin, 5, 5});
    std::map<std::string, Attr> attrs{{"stride", std::vector<int64_t>{2, 2}}, {"groups", groups}};
    if (groups == 2) attrs["dilation"] = std::vector<int64_t>{2, 2};
    Node ct = make("up", "conv_transpose2d", {"x"}, attrs);
    ct.params.set("weight", at::randn({cin, cout / groups, 3, 3}).set_requires_grad(true));
    ct.params.set("bias", at::randn({cout}).set_requires_grad(true));
    g.add_node(ct);
    g.add_node(bn_node("bn", "up", at::linspace(0.5, 2.5, cout), at::randn({cout}), at::randn({cout}),
                       at::rand({cout}) + 0.5, 1e-5));
    g.set_outputs({"bn"});
    GraphModule m(g);
    const at::Tensor x = at::randn({2, cin, 5, 5});
    const at::Tensor before = run_eval(m, x);
    ASSERT_EQ(f::fold_batchnorm(m).fused.size(), 1u);
    EXPECT_TRUE(same_function(run_eval(m, x), before)) << "groups " << groups;
  }
}

TEST_F(FoldPass, FuseConvBN) {
  GraphModule m(small_net());
  const at::Tensor x = at::randn({4, 3, 8, 8});
  const at::Tensor before = run_eval(m, x);
  f::Report r = f::fold_batchnorm(m);
  EXPECT_EQ(r.fused, (std::vector<std::string>{"features.0 ← features.1"}));
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_EQ(count_op(m->graph(), "batch_norm"), 0);
  EXPECT_EQ(m->graph().nodes().size(), 5u);
  EXPECT_TRUE(same_function(run_eval(m, x), before));
  // The folded parameters are registered under the conv's name; the BN's are gone.
  auto params = m->named_parameters();
  EXPECT_TRUE(params.contains("features.0.bias"));
  EXPECT_FALSE(params.contains("features.1.weight"));
}

TEST_F(FoldPass, DontFuseWhenConvOutputHasAnotherUser) {
  Graph g = small_net();
  Node extra = make("side", "relu", {"features.0"});
  g.add_node(extra);
  g.set_outputs({"classifier", "side"});
  f::Report r = f::fold_batchnorm(g);
  EXPECT_TRUE(r.fused.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].find("other users (side)"), std::string::npos) << r.skipped[0];
  EXPECT_EQ(count_op(g, "batch_norm"), 1);
}

TEST_F(FoldPass, DontFuseWhenConvOutputIsAGraphOutput) {
  Graph g = small_net();
  g.set_outputs({"classifier", "features.0"});
  f::Report r = f::fold_batchnorm(g);
  EXPECT_TRUE(r.fused.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].find("graph output"), std::string::npos) << r.skipped[0];
}

TEST_F(FoldPass, DontFuseWhenTheWeightIsComputedByATransform) {
  WeightTransform doubling;
  doubling.name = "test_doubling";
  doubling.description = "2·W";
  doubling.kind = TransformKind::kQuantizer;
  doubling.apply = [](const Node&, const at::Tensor& w, bool) { return w * 2; };
  register_weight_transform(std::move(doubling));
  Graph g = small_net();
  g.node("features.0").weight_transforms = {"test_doubling"};
  f::Report r = f::fold_batchnorm(g);
  EXPECT_TRUE(r.fused.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].find("weight transform 'test_doubling'"), std::string::npos) << r.skipped[0];
}

TEST_F(FoldPass, DontFuseBatchNormOnAGraphInputOrAfterAnActivation) {
  Graph g;
  g.add_input("x", {2, 3, 4, 4});
  g.add_node(bn_node("bn0", "x", at::ones({3}), at::zeros({3}), at::zeros({3}), at::ones({3}), 1e-5));
  g.add_node(make("act", "relu", {"bn0"}));
  g.add_node(bn_node("bn1", "act", at::ones({3}), at::zeros({3}), at::zeros({3}), at::ones({3}), 1e-5));
  g.set_outputs({"bn1"});
  f::Report r = f::fold_batchnorm(g);
  EXPECT_TRUE(r.fused.empty());
  EXPECT_EQ(r.skipped.size(), 2u) << r.summary();
  EXPECT_EQ(count_op(g, "batch_norm"), 2);
}

TEST_F(FoldPass, DontFuseLinearWhoseOutputIsNotTwoDimensional) {
  // BatchNorm1d over [N, L, C] normalizes dim 1 (L), not the linear layer's features.
  Graph g;
  g.add_input("x", {2, 4, 6});
  Node fc = make("fc", "linear", {"x"});
  fc.params.set("weight", at::randn({4, 6}));
  g.add_node(fc);
  g.add_node(bn_node("bn", "fc", at::ones({4}), at::zeros({4}), at::zeros({4}), at::ones({4}), 1e-5));
  g.set_outputs({"bn"});
  f::Report r = f::fold_batchnorm(g);
  EXPECT_TRUE(r.fused.empty());
  EXPECT_EQ(r.skipped.size(), 1u);
}

TEST_F(FoldPass, RefusesAModuleInTrainingMode) {
  GraphModule m(small_net());
  m->train();
  try {
    f::fold_batchnorm(m);
    FAIL() << "expected whittle::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training mode"), std::string::npos) << e.what();
  }
  EXPECT_EQ(count_op(m->graph(), "batch_norm"), 1);  // untouched
}

TEST_F(FoldPass, TargetsAndIgnoreSelectBatchNorms) {
  Graph g = build_model("resnet20");
  f::FoldOptions o;
  o.ignore = {"re:layer3\\..*"};
  f::Report r = f::fold_batchnorm(g, o);
  EXPECT_EQ(r.fused.size(), 21u - 7u);  // 21 BNs, 7 of them in layer3 (3 blocks × 2 + shortcut)
  EXPECT_EQ(count_op(g, "batch_norm"), 7);
}

TEST_F(FoldPass, RemoveBiasBeforeBatchNormKeepsTrainAndEvalOutputs) {
  GraphModule a(small_net());
  GraphModule b(a->graph().clone());
  f::Report r = f::remove_bias_before_batchnorm(b->graph());
  b->sync();
  ASSERT_EQ(r.fused.size(), 1u);
  EXPECT_FALSE(b->graph().node("features.0").params.contains("bias"));
  const at::Tensor x = at::randn({4, 3, 8, 8});
  EXPECT_TRUE(same_function(run_eval(b, x), run_eval(a, x)));
  // Training mode: batch statistics subtract the mean, bias included; the running means then agree.
  a->train();
  b->train();
  at::Tensor ya = a->forward(x), yb = b->forward(x);
  EXPECT_TRUE(all_close(yb, ya, 1e-5, 1e-5));
  const at::Tensor& ma = a->graph().node("features.1").buffers.at("running_mean");
  const at::Tensor& mb = b->graph().node("features.1").buffers.at("running_mean");
  EXPECT_TRUE(all_close(mb + a->graph().node("features.0").params.at("bias"), ma, 1e-5, 1e-5));
}

// ---------------------------------------------------------------- BN → threshold

TEST_F(Threshold, HandWorkedThresholds) {
  // σ² = 4, ε = 0 (σ = 2), μ = 3, β = 1:
  //   γ = 2:  τ = 3 − 1·2/2 = 2, compare y ≥ 2;   γ = −2: τ = 3 + 1 = 4, compare y ≤ 4;
  //   γ = 0, β = −1: always −1;  γ = 0, β = 0: always +1 (sign(0) = +1).
  f::BatchNormParams bn{vec({3, 3, 3, 3}), vec({4, 4, 4, 4}), vec({2, -2, 0, 0}), vec({1, 1, -1, 0}), 0.0};
  f::SignThreshold t = f::bn_sign_threshold(bn);
  EXPECT_FLOAT_EQ(t.threshold[0].item<float>(), 2.0f);
  EXPECT_FLOAT_EQ(t.threshold[1].item<float>(), 4.0f);
  EXPECT_TRUE(std::isinf(t.threshold[2].item<float>()) && t.threshold[2].item<float>() > 0);
  EXPECT_TRUE(std::isinf(t.threshold[3].item<float>()) && t.threshold[3].item<float>() < 0);
  EXPECT_TRUE(all_close(t.direction, vec({1, -1, 1, 1}), 0, 0));
  // y = [1, 2, 4, 5] in every channel; the reference is sign(BN(y)) with sign(0) = +1.
  at::Tensor y = vec({1, 2, 4, 5}).reshape({4, 1}).expand({4, 4}).contiguous();
  at::Tensor got = f::apply_sign_threshold(y, t.threshold, t.direction);
  at::Tensor expected = at::tensor({-1.f, 1.f, -1.f, 1.f,  // y = 1
                                    1.f, 1.f, -1.f, 1.f,   // y = 2: BN = 0 in channel 0 → +1
                                    1.f, 1.f, -1.f, 1.f,   // y = 4: BN = 0 in channel 1 → +1
                                    1.f, -1.f, -1.f, 1.f})
                            .reshape({4, 4});
  EXPECT_TRUE(all_close(got, expected, 0, 0));
}

TEST_F(Threshold, MatchesBatchNormThenSignOnRandomData) {
  quantize::register_all();
  Graph g;
  g.add_input("x", {8, 6, 5, 5});
  at::Tensor gamma = at::randn({6});
  gamma[2] = 0.0;  // a constant channel
  g.add_node(bn_node("bn", "x", gamma, at::randn({6}), at::randn({6}), at::rand({6}) + 0.1, 1e-5));
  g.add_node(make("sign", "act_quant", {"bn"}, {{"method", std::string("sign")}, {"activation_bits", int64_t{1}}}));
  g.add_node(make("pool", "max_pool2d", {"sign"}, {{"kernel_size", int64_t{2}}}));
  g.set_outputs({"pool"});
  GraphModule m(g);
  const at::Tensor x = at::randn({8, 6, 5, 5}) * 2;
  const at::Tensor before = run_eval(m, x);
  f::Report r = f::fold_bn_into_threshold(m);
  ASSERT_EQ(r.fused.size(), 1u) << r.summary();
  EXPECT_EQ(count_op(m->graph(), "batch_norm"), 0);
  EXPECT_EQ(m->graph().node("sign").op, "threshold_sign");
  EXPECT_TRUE(run_eval(m, x).equal(before));
}

TEST_F(Threshold, DontFuseWhenTheBatchNormOutputHasAnotherUser) {
  quantize::register_all();
  Graph g;
  g.add_input("x", {2, 3, 4, 4});
  g.add_node(bn_node("bn", "x", at::ones({3}), at::zeros({3}), at::zeros({3}), at::ones({3}), 1e-5));
  g.add_node(make("sign", "act_quant", {"bn"}, {{"method", std::string("sign")}, {"activation_bits", int64_t{1}}}));
  g.add_node(make("other", "relu", {"bn"}));
  g.add_node(make("sum", "add", {"sign", "other"}));
  g.set_outputs({"sum"});
  f::Report r = f::fold_bn_into_threshold(g);
  EXPECT_TRUE(r.fused.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(g.node("sign").op, "act_quant");
}

// BNN and XNOR LeNet-5 trained by their recipes (one epoch, cached under the build folder),
// evaluated on the 2,000 bundled MNIST test digits before and after fusion.
// The cache is keyed by the recipe text, the model's graph and the checkpoint format, so a
// changed recipe, zoo model or layout trains again.
std::string trained_checkpoint(const std::string& method) {
  const std::string recipe_path = join_path(source_dir(), "recipes/mnist/lenet5_" + method + ".yaml");
  const size_t key = std::hash<std::string>{}(read_file(recipe_path) + graph_to_json(build_model("lenet5")) +
                                              std::to_string(kCheckpointFormatVersion));
  const std::string dir = join_path(binary_dir(), "testdata/fuse/lenet5_" + method + "_" + std::to_string(key % 1000000007));
  const std::string ckpt = join_path(dir, "model.h5");
  if (is_regular_file(ckpt)) return ckpt;
  runner::Recipe r = runner::load_recipe(recipe_path,
                                         {"training.epochs=1", "data.num_workers=1",
                                          "data.train=" + join_path(source_dir(), "data/mnist10k"),
                                          "data.test=" + join_path(source_dir(), "data/mnist10k")});
  runner::RunOptions o;
  o.out_dir = dir;
  o.overwrite = true;  // a run that did not finish is trained again
  runner::run_recipe(r, o);
  return ckpt;
}

class BinaryDeploy : public ::testing::TestWithParam<std::string> {};

TEST_P(BinaryDeploy, ThresholdsPredictTheSameClassOnAllMnistTestDigits) {
  Checkpoint c = load_checkpoint(trained_checkpoint(GetParam()));
  data::LoadOptions lo;
  lo.split = "t10k";
  data::Dataset test = data::load_dataset(join_path(source_dir(), "data/mnist10k"), lo);
  ASSERT_EQ(test.size(), 2000);
  const at::Tensor x = data::normalize(test.images, {0.1307}, {0.3081});
  GraphModule m(c.graph);
  const at::Tensor before = run_eval(m, x);
  const int64_t bns = count_op(m->graph(), "batch_norm");
  f::Report r = f::fuse_for_inference(m);
  // Every BN feeding a binarizer became a threshold, and every BN after a plain-weight layer was
  // folded. The BN after the last binarized layer (fc2 → bn4 → relu → full-precision fc3) stays:
  // its layer's weights are packed binary codes, which a per-channel scale would break.
  EXPECT_GE(count_op(m->graph(), "threshold_sign"), 2) << r.summary();
  const Graph& g = m->graph();
  int64_t remaining = 0;
  for (const auto& n : g.nodes()) {
    if (n.op != "batch_norm") continue;
    ++remaining;
    const Node& producer = g.node(g.value(n.inputs[0]).producer);
    EXPECT_FALSE(producer.weight_transforms.empty()) << n.name << " follows a plain layer: " << r.summary();
    for (const auto& u : g.users(n.outputs[0])) {
      const Node& user = g.node(u);
      EXPECT_FALSE(user.op == "act_quant" && user.attr_str("method") == "sign") << n.name << " feeds a binarizer";
    }
  }
  EXPECT_LE(remaining, 1) << r.summary();
  EXPECT_EQ(static_cast<int64_t>(r.fused.size()) + remaining, bns) << r.summary();
  const at::Tensor after = run_eval(m, x);
  const int64_t differ = after.argmax(1).ne(before.argmax(1)).sum().item<int64_t>();
  EXPECT_EQ(differ, 0) << "digits whose predicted class changed";
  // The deploy form survives a checkpoint round trip.
  const std::string out = join_path(binary_dir(), "testdata/fuse/lenet5_" + GetParam() + "_deploy.h5");
  save_checkpoint(out, m->graph());
  GraphModule reloaded(load_checkpoint(out).graph);
  EXPECT_TRUE(run_eval(reloaded, x).equal(after));
}

INSTANTIATE_TEST_SUITE_P(Methods, BinaryDeploy, ::testing::Values("bnn", "xnor"));

// ---------------------------------------------------------------- RepVGG

// A RepVGG block over C = 4 channels with groups = 2: relu(BN(conv3×3) + BN(conv1×1) + BN(x)).
Graph repvgg_block(int64_t stride) {
  Graph g;
  g.add_input("x", {2, 4, 6, 6});
  auto conv = [&](const std::string& name, int64_t k) {
    Node c = make(name, "conv2d", {"x"},
                  {{"stride", std::vector<int64_t>{stride, stride}}, {"padding", std::vector<int64_t>{k / 2, k / 2}},
                   {"groups", int64_t{2}}});
    c.params.set("weight", at::randn({4, 2, k, k}).set_requires_grad(true));
    return g.add_node(c);
  };
  auto bn = [&](const std::string& name, const std::string& in) {
    return g.add_node(bn_node(name, in, at::rand({4}) + 0.5, at::randn({4}), at::randn({4}), at::rand({4}) + 0.5, 1e-5));
  };
  std::string dense = bn("blk.rbr_dense.bn", conv("blk.rbr_dense.conv", 3));
  std::string point = bn("blk.rbr_1x1.bn", conv("blk.rbr_1x1.conv", 1));
  std::string sum = g.add_node(make("blk.add1", "add", {dense, point}));
  if (stride == 1) sum = g.add_node(make("blk.add2", "add", {sum, bn("blk.rbr_identity", "x")}));
  g.add_node(make("blk.relu", "relu", {sum}));
  g.set_outputs({"blk.relu"});
  return g;
}

TEST_F(Repvgg, GroupedBlockMergesIntoOneConv) {
  for (int64_t stride : {1, 2}) {
    GraphModule m(repvgg_block(stride));
    const at::Tensor x = at::randn({2, 4, 6, 6});
    const at::Tensor before = run_eval(m, x);
    f::Report r = f::reparameterize_repvgg(m);
    ASSERT_EQ(r.fused.size(), 1u) << r.summary();
    const Graph& g = m->graph();
    ASSERT_EQ(g.nodes().size(), 2u) << g.to_string();
    const Node& c = g.nodes()[0];
    EXPECT_EQ(c.name, "blk.rbr_reparam");
    EXPECT_EQ(c.attr_int("groups"), 2);
    EXPECT_EQ(c.params.at("weight").sizes(), (at::IntArrayRef{4, 2, 3, 3}));
    EXPECT_TRUE(c.params.contains("bias"));
    EXPECT_TRUE(same_function(run_eval(m, x), before)) << "stride " << stride;
  }
}

TEST_F(Repvgg, DontMergeWhenABranchOutputHasAnotherUser) {
  Graph g = repvgg_block(1);
  g.add_node(make("peek", "relu", {"blk.rbr_1x1.conv"}));
  g.set_outputs({"blk.relu", "peek"});
  f::Report r = f::reparameterize_repvgg(g);
  EXPECT_TRUE(r.fused.empty());
  ASSERT_FALSE(r.skipped.empty());
  EXPECT_NE(r.skipped[0].find("other users"), std::string::npos) << r.summary();
}

TEST_F(Repvgg, PlainResidualAddsAreNotCandidates) {
  Graph g = build_model("resnet20");
  f::Report r = f::reparameterize_repvgg(g);
  EXPECT_TRUE(r.fused.empty());
  EXPECT_TRUE(r.skipped.empty()) << r.summary();
}

// ---------------------------------------------------------------- whole models

class ZooModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { at::manual_seed(0); }
};

TEST_P(ZooModel, FusedEqualsUnfusedAndNoFoldableBatchNormIsLeft) {
  ZooOptions zo;
  zo.seed = 1;
  Graph g = build_model(GetParam(), zo);
  randomize_batchnorm(g);
  GraphModule m(g);
  const at::Tensor x = at::randn({3, 3, 32, 32});
  const at::Tensor before = run_eval(m, x);
  f::Report r = f::fuse_for_inference(m);
  EXPECT_TRUE(r.skipped.empty()) << r.summary();
  EXPECT_EQ(count_op(m->graph(), "batch_norm"), 0);
  EXPECT_EQ(f::count_foldable_batchnorm(m->graph()), 0);
  EXPECT_TRUE(same_function(run_eval(m, x), before));
  if (GetParam() == "repvgg_a0") {
    EXPECT_EQ(count_op(m->graph(), "add"), 0);
    EXPECT_EQ(count_op(m->graph(), "conv2d"), 22);  // 1 + 2 + 4 + 14 + 1 blocks, one 3×3 conv each
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ZooModel, ::testing::Values("resnet20", "mobilenet_v2", "vgg_small", "repvgg_a0"));

// ---------------------------------------------------------------- BN folding during QAT

TEST_F(QatFold, TrainingForwardEqualsConvThenBatchStatistics) {
  // Without a quantizer, conv_bn_qat in training computes exactly conv → BN with batch statistics
  // (the σ_running/σ_batch correction undoes the running-statistics fold), and updates the running
  // statistics the same way.
  GraphModule a(small_net());
  GraphModule b(a->graph().clone());
  f::Report r = f::prepare_qat_batchnorm(b);
  ASSERT_EQ(r.fused.size(), 1u);
  EXPECT_EQ(b->graph().node("features.0").op, "conv_bn_qat");
  a->train();
  b->train();
  const at::Tensor x = at::randn({4, 3, 8, 8});
  EXPECT_TRUE(all_close(b->forward(x), a->forward(x), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(b->graph().node("features.0").buffers.at("bn_running_mean"),
                        a->graph().node("features.1").buffers.at("running_mean"), 1e-6, 1e-5));
  EXPECT_TRUE(all_close(b->graph().node("features.0").buffers.at("bn_running_var"),
                        a->graph().node("features.1").buffers.at("running_var"), 1e-6, 1e-5));
  // Eval, and frozen training, use the folded running-statistics form.
  EXPECT_TRUE(same_function(run_eval(b, x), run_eval(a, x)));
  EXPECT_EQ(f::freeze_qat_batchnorm(b->graph()), 1);
  b->sync();
  b->train();
  at::Tensor frozen = b->forward(x);
  EXPECT_TRUE(same_function(frozen, run_eval(a, x)));
}

TEST_F(QatFold, DoReFaW4A4Resnet20ExportsWithoutBatchNormAndMatchesItsEvalOutputs) {
  ZooOptions zo;
  zo.seed = 3;
  GraphModule m(build_model("resnet20", zo));
  quantize::Config qc;
  qc.method = "dorefa";
  qc.weight_bits = 4;
  qc.activation_bits = 4;
  quantize::apply(m, qc);

  // The modifier, as a recipe would configure it: {mode: qat, freeze_bn_epoch: 1}.
  runner::register_builtin_modifiers();
  runner::Recipe recipe = runner::parse_recipe(
      std::string("model: {name: resnet20}\n") +
      "data: {train: " + join_path(source_dir(), "data/mnist10k") + ", test: " + join_path(source_dir(), "data/mnist10k") + "}\n"
      "training: {epochs: 2}\n"
      "modifiers:\n"
      "  - {name: quantize, method: dorefa, weight_bits: 4, activation_bits: 4}\n"
      "  - {name: fuse_batchnorm, mode: qat, freeze_bn_epoch: 1}\n",
      "<test>", source_dir());
  auto mod = runner::modifier_info("fuse_batchnorm").create(recipe.modifiers.at(1));
  runner::TrainContext tc;
  tc.model = m;
  tc.recipe = &recipe;
  mod->on_start(tc);
  EXPECT_TRUE(tc.parameters_changed);
  EXPECT_EQ(count_op(m->graph(), "batch_norm"), 0);
  EXPECT_EQ(count_op(m->graph(), "conv_bn_qat"), 21);
  // Quantized layers keep their quantizer, applied to the folded weight.
  EXPECT_EQ(m->graph().node("layer1.0.conv1").weight_transforms, (std::vector<std::string>{"bn_fold", "dorefa"}));

  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const at::Tensor gamma_before = m->graph().node("layer1.0.conv1").params.at("bn_weight").clone();
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    tc.epoch = static_cast<double>(epoch);
    tc.epoch_index = epoch;
    mod->on_epoch_begin(tc);
    m->train();
    for (int step = 0; step < 3; ++step) {
      at::Tensor x = at::randn({8, 3, 32, 32});
      at::Tensor y = at::randint(10, {8}, at::kLong);
      opt.zero_grad();
      at::Tensor loss = at::cross_entropy_loss(m->forward(x), y);
      loss.backward();
      opt.step();
    }
  }
  EXPECT_EQ(m->graph().node("layer1.0.conv1").attr_int("bn_frozen"), 1);
  EXPECT_FALSE(m->graph().node("layer1.0.conv1").params.at("bn_weight").equal(gamma_before));  // γ trained

  const at::Tensor x = at::randn({4, 3, 32, 32});
  const at::Tensor eval_out = run_eval(m, x);
  mod->on_finish(tc);
  EXPECT_EQ(count_op(m->graph(), "conv_bn_qat"), 0);
  EXPECT_EQ(count_op(m->graph(), "batch_norm"), 0);
  EXPECT_EQ(m->graph().node("layer1.0.conv1").weight_transforms, std::vector<std::string>{"dorefa"});

  // Export (packed checkpoint) and reload: the outputs are the eval outputs of the QAT model.
  const std::string path = join_path(binary_dir(), "testdata/fuse/resnet20_dorefa_w4a4_qat.h5");
  make_directories(join_path(binary_dir(), "testdata/fuse"));
  save_checkpoint(path, m->graph());
  Checkpoint c = load_checkpoint(path);
  EXPECT_EQ(count_op(c.graph, "batch_norm"), 0);
  EXPECT_EQ(c.graph.node("layer1.0.conv1").weight_transforms, std::vector<std::string>{"packed"});
  GraphModule exported(c.graph);
  EXPECT_TRUE(same_function(run_eval(exported, x), eval_out));
  EXPECT_TRUE(run_eval(m, x).equal(eval_out));  // finalize itself is exact
}

// A learned weight step set from the unfolded weight W must follow it to W·γ/σ when QAT folding
// puts bn_fold in front of the quantizer: per output channel exactly ×|γ/σ| (so every code stays
// what it was), per tensor ×mean|W·γ/σ|/mean|W|. Without this the steps of an LSQ layer folded
// after quantize (the recipe order) were off by γ/σ per channel.
TEST_F(QatFold, LsqWeightStepsFollowTheFoldedWeight) {
  for (const std::string granularity : {"per_channel", "per_tensor"}) {
    SCOPED_TRACE(granularity);
    GraphModule m(small_net());
    Node& bn = m->graph().node("features.1");
    {
      at::NoGradGuard no_grad;
      bn.params.at("weight")[0] = -0.7;  // a negative γ: the step scales by |γ/σ|
      bn.params.at("weight")[1] = 0.0;   // a γ of 0: the channel keeps its step
    }
    const at::Tensor sigma = (bn.buffers.at("running_var") + 1e-5).sqrt();
    const at::Tensor s = bn.params.at("weight").detach() / sigma;
    quantize::Config qc;
    qc.method = "lsq";
    qc.weight_bits = 4;
    qc.activation_bits = 4;
    qc.options["granularity"] = granularity;
    qc.targets = {"features.0"};
    quantize::apply(m, qc);
    const Node& before = m->graph().node("features.0");
    const at::Tensor w = before.params.at("weight").detach().clone();
    const at::Tensor step = before.params.at("weight_step").detach().clone();
    const quantize::EncodedWeight codes_before = quantize::lsq_encode(w, step, 4);

    ASSERT_EQ(f::prepare_qat_batchnorm(m).fused.size(), 1u);
    const Node& after = m->graph().node("features.0");
    EXPECT_EQ(after.weight_transforms, (std::vector<std::string>{"bn_fold", "lsq"}));
    const at::Tensor folded = w * s.reshape({8, 1, 1, 1});
    at::Tensor expected = granularity == "per_channel" ? step * s.abs() : step * folded.abs().mean() / w.abs().mean();
    if (granularity == "per_channel") expected[1] = step[1];
    // Margin 1e-5: a mean over 27 or 216 weights may sum in another order with another thread
    // count or instruction set (a few float ulps); the bug this holds was off by γ/σ, 0.5..1.6.
    EXPECT_TRUE(all_close(after.params.at("weight_step").detach(), expected, 1e-5, 1e-5))
        << after.params.at("weight_step") << " vs " << expected;
    if (granularity == "per_channel") {
      const quantize::EncodedWeight codes_after = quantize::lsq_encode(folded, after.params.at("weight_step"), 4);
      // Channels 2..7 (γ > 0) keep every code; channel 0's weights changed sign, channel 1's are 0.
      EXPECT_TRUE(codes_after.codes.slice(0, 2).equal(codes_before.codes.slice(0, 2)));
      // A later stage at 2 bits calibrates its steps on the folded weight too: channels 2..7 get
      // the steps an unfolded twin gets, times γ/σ (the MSE calibrator scales with its input, to
      // within its histogram's bins: 0.1 % here, where γ/σ itself ranges over 0.5..1.6; the 0.5 %
      // margin leaves room for another CPU's bin edges, far from the unfolded steps' error).
      GraphModule twin(small_net());
      {
        at::NoGradGuard no_grad;
        twin->graph().node("features.0").params.at("weight").copy_(w);
      }
      quantize::apply(twin, qc);
      quantize::Config two = qc;
      two.weight_bits = 2;
      two.activation_bits = 2;
      two.options["step_init"] = std::string("mse");
      const quantize::QuantizerMethod& lsq = quantize::quantizer_method("lsq");
      lsq.change_bits(twin->graph(), {"features.0"}, two);
      lsq.change_bits(m->graph(), {"features.0"}, two);
      const at::Tensor folded_steps = m->graph().node("features.0").params.at("weight_step").detach();
      const at::Tensor twin_steps = twin->graph().node("features.0").params.at("weight_step").detach();
      EXPECT_TRUE(all_close(folded_steps.slice(0, 2), (twin_steps * s).slice(0, 2), 0, 5e-3))
          << folded_steps << " vs " << twin_steps * s;
    }
  }
}

TEST_F(QatFold, InferenceModeModifierFoldsAtTheEnd) {
  runner::register_builtin_modifiers();
  runner::Recipe recipe = runner::parse_recipe(
      std::string("model: {name: repvgg_a0}\n") +
      "data: {train: " + join_path(source_dir(), "data/mnist10k") + ", test: " + join_path(source_dir(), "data/mnist10k") + "}\n"
      "training: {epochs: 1}\n"
      "modifiers:\n"
      "  - {name: fuse_batchnorm}\n",
      "<test>", source_dir());
  auto mod = runner::modifier_info("fuse_batchnorm").create(recipe.modifiers.at(0));
  ZooOptions zo;
  zo.seed = 2;
  Graph g = build_model("repvgg_a0", zo);
  randomize_batchnorm(g);
  runner::TrainContext tc;
  tc.model = GraphModule(g);
  tc.recipe = &recipe;
  mod->on_start(tc);
  EXPECT_EQ(count_op(tc.model->graph(), "batch_norm"), 61);  // 22 blocks × 2 + 17 identity BNs: untouched until the end
  const at::Tensor x = at::randn({2, 3, 32, 32});
  const at::Tensor before = run_eval(tc.model, x);
  tc.model->train();  // as the trainer leaves it
  mod->on_finish(tc);
  EXPECT_EQ(count_op(tc.model->graph(), "batch_norm"), 0);
  EXPECT_EQ(count_op(tc.model->graph(), "conv2d"), 22);
  EXPECT_TRUE(same_function(run_eval(tc.model, x), before));
  // freeze_bn_epoch belongs to mode qat.
  runner::ModifierSpec bad = recipe.modifiers.at(0);
  bad.settings["freeze_bn_epoch"] = 3;
  EXPECT_THROW(runner::modifier_info("fuse_batchnorm").create(bad), Error);
}

TEST_F(QatFold, ModifierRejectsQuantizeListedAfterIt) {
  runner::register_builtin_modifiers();
  runner::Recipe recipe = runner::parse_recipe(
      std::string("model: {name: lenet5}\n") +
      "data: {train: " + join_path(source_dir(), "data/mnist10k") + ", test: " + join_path(source_dir(), "data/mnist10k") + "}\n"
      "training: {epochs: 2}\n"
      "modifiers:\n"
      "  - {name: fuse_batchnorm, mode: qat}\n"
      "  - {name: quantize, method: dorefa}\n",
      "<test>", source_dir());
  auto mod = runner::modifier_info("fuse_batchnorm").create(recipe.modifiers.at(0));
  runner::TrainContext tc;
  tc.model = GraphModule(build_model("lenet5"));
  tc.recipe = &recipe;
  EXPECT_THROW(mod->on_start(tc), Error);
}

}  // namespace
}  // namespace whittle::test
