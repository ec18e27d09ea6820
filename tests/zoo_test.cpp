// The model zoo against its PyTorch references (tests/reference/zoo_models.py): parameter counts
// and MACs, state_dict names and shapes, eval-mode outputs with the reference's weights, training
// mode, options, and initialization.
//
// The references are traced by the zoo_reference fixture (tests/reference/make_zoo_reference.py)
// into ${build}/testdata/zoo/<name>.pt, with <name>.json holding PyTorch's parameter and MAC counts.

#include <torch/script.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "graph/zoo.h"
#include "support.h"

namespace whittle {
namespace {

using test::all_close;

const std::vector<std::string> kModels = {"lenet5",   "vgg_small", "nin",      "nin_gc",       "resnet20",
                                          "resnet32", "resnet56",  "mobilenet_v2", "repvgg_a0"};

std::string reference_path(const std::string& name, const std::string& ext) {
  return test::binary_dir() + "/testdata/zoo/" + name + ext;
}

nlohmann::json reference_info(const std::string& name) {
  std::ifstream in(reference_path(name, ".json"));
  if (!in) throw Error("cannot open " + reference_path(name, ".json") + " (run the generate_zoo_reference test)");
  return nlohmann::json::parse(in);
}

// name → shape of every parameter and buffer; buffers are marked with a trailing " (buffer)".
std::map<std::string, std::vector<int64_t>> tensor_shapes(const GraphModule& m) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : m->named_parameters()) out[p.key()] = p.value().sizes().vec();
  for (const auto& b : m->named_buffers()) out[b.key() + " (buffer)"] = b.value().sizes().vec();
  return out;
}

std::map<std::string, std::vector<int64_t>> tensor_shapes(const torch::jit::Module& m) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : m.named_parameters(true)) out[p.name] = p.value.sizes().vec();
  for (const auto& b : m.named_buffers(true)) out[b.name + " (buffer)"] = b.value.sizes().vec();
  return out;
}

// Copies every parameter and buffer of the reference into the GraphModule, by name.
void load_reference_weights(GraphModule& m, const torch::jit::Module& ref) {
  at::NoGradGuard no_grad;
  auto params = m->named_parameters();
  auto buffers = m->named_buffers();
  for (const auto& p : ref.named_parameters(true)) {
    at::Tensor* dst = params.find(p.name);
    if (!dst) throw Error("reference parameter '" + p.name + "' has no counterpart in the zoo graph");
    dst->copy_(p.value);
  }
  for (const auto& b : ref.named_buffers(true)) {
    at::Tensor* dst = buffers.find(b.name);
    if (!dst) throw Error("reference buffer '" + b.name + "' has no counterpart in the zoo graph");
    dst->copy_(b.value);
  }
}

class ZooModelTest : public test::SeededTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(ZooModelTest, ParamsAndMacsEqualPyTorch) {
  const nlohmann::json info = reference_info(GetParam());
  Graph g = build_model(GetParam());
  EXPECT_EQ(g.value(g.inputs()[0]).shape, info["input_shape"].get<Shape>());
  EXPECT_EQ(g.value(g.outputs()[0]).shape, info["output_shape"].get<Shape>());
  NodeCost cost = graph_cost(g);
  EXPECT_EQ(cost.params, info["params"].get<int64_t>());
  EXPECT_EQ(cost.macs, info["macs"].get<int64_t>());
}

TEST_P(ZooModelTest, StateDictNamesAndShapesEqualPyTorch) {
  torch::jit::Module ref = torch::jit::load(reference_path(GetParam(), ".pt"));
  GraphModule m(build_model(GetParam()));
  auto ours = tensor_shapes(m);
  auto theirs = tensor_shapes(ref);
  for (const auto& kv : theirs) {
    auto it = ours.find(kv.first);
    if (it == ours.end()) {
      ADD_FAILURE() << "reference key '" << kv.first << "' is missing from the zoo graph";
      continue;
    }
    EXPECT_EQ(it->second, kv.second) << kv.first;
  }
  for (const auto& kv : ours)
    EXPECT_TRUE(theirs.count(kv.first)) << "zoo graph key '" << kv.first << "' is not in the reference";
}

// Tolerance: both sides run the same float32 ATen kernels on the same input (on a CPU build the
// outputs usually agree bit for bit), but the traced reference and the graph may reach them through
// different dispatch paths (oneDNN vs. native convolution, thread-dependent accumulation orders), so
// only agreement to float32 round-off is guaranteed, and that grows with depth (ResNet-56, RepVGG's
// 22 blocks). rtol 1e-5 bounds it for normal-sized logits; atol is 1e-5 of the largest |logit| so
// that logits near zero (where cancellation makes the relative error large) are judged on the
// output's scale rather than their own.
TEST_P(ZooModelTest, EvalForwardEqualsPyTorch) {
  torch::jit::Module ref = torch::jit::load(reference_path(GetParam(), ".pt"));
  ref.eval();
  GraphModule m(build_model(GetParam()));
  load_reference_weights(m, ref);
  m->eval();
  Shape shape = m->graph().value("input").shape;
  shape[0] = 2;
  at::Tensor x = at::randn(shape);
  at::Tensor expected = ref.forward({x}).toTensor();
  at::Tensor actual;
  {
    at::NoGradGuard no_grad;
    actual = m->forward(x);
  }
  const double scale = expected.abs().max().item<double>();
  ASSERT_GT(scale, 0.0);
  EXPECT_TRUE(all_close(actual, expected, 1e-5 * scale, 1e-5));
  // The weights really came from the reference: a freshly initialized model disagrees.
  GraphModule fresh(build_model(GetParam()));
  fresh->eval();
  EXPECT_FALSE(all_close(fresh->forward(x).detach(), expected, 1e-5 * scale, 1e-5));
}

TEST_P(ZooModelTest, TrainModeRunsAndGradientsReachEveryParameter) {
  GraphModule m(build_model(GetParam()));
  m->train();
  Shape shape = m->graph().value("input").shape;
  shape[0] = 4;
  at::Tensor logits = m->forward(at::randn(shape));
  ASSERT_EQ(logits.sizes(), (at::IntArrayRef{4, 10}));
  at::Tensor loss = at::cross_entropy_loss(logits, at::randint(0, 10, {4}, at::kLong));
  ASSERT_TRUE(std::isfinite(loss.item<double>()));
  loss.backward();
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(p.value().grad().isfinite().all().item<bool>()) << p.key();
    // A bias right before a training-mode BN has a zero gradient in exact arithmetic (BN removes
    // the per-channel mean), so only weights must have a non-zero one.
    if (p.key().size() >= 7 && p.key().compare(p.key().size() - 7, 7, ".weight") == 0) {
      EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
    }
  }
  // Training updated the BN statistics.
  for (const auto& b : m->named_buffers()) {
    if (b.key().size() > 19 && b.key().compare(b.key().size() - 19, 19, "num_batches_tracked") == 0) {
      EXPECT_EQ(b.value().item<int64_t>(), 1) << b.key();
    }
  }
}

TEST_P(ZooModelTest, InitializationFollowsTorchNnDefaults) {
  Graph g = build_model(GetParam());
  for (const Node& n : g.nodes()) {
    for (const auto& kv : n.params) {
      EXPECT_TRUE(kv.second.requires_grad()) << n.name << "." << kv.first;
      EXPECT_EQ(kv.second.scalar_type(), at::kFloat) << n.name << "." << kv.first;
    }
    if (n.op == "conv2d" || n.op == "linear") {
      const at::Tensor& w = n.params.at("weight");
      const double bound = 1.0 / std::sqrt(static_cast<double>(w.numel() / w.size(0)));
      EXPECT_LE(w.abs().max().item<double>(), bound) << n.name;
      // U(−b, b) has standard deviation b/√3; loose check for tensors with enough samples.
      if (w.numel() >= 1000) {
        EXPECT_NEAR(w.std().item<double>(), bound / std::sqrt(3.0), 0.1 * bound) << n.name;
      }
      if (const at::Tensor* b = n.params.find("bias")) {
        EXPECT_LE(b->abs().max().item<double>(), bound) << n.name;
      }
    } else if (n.op == "batch_norm") {
      EXPECT_TRUE(n.params.at("weight").eq(1).all().item<bool>()) << n.name;
      EXPECT_TRUE(n.params.at("bias").eq(0).all().item<bool>()) << n.name;
      EXPECT_TRUE(n.buffers.at("running_mean").eq(0).all().item<bool>()) << n.name;
      EXPECT_TRUE(n.buffers.at("running_var").eq(1).all().item<bool>()) << n.name;
      const at::Tensor& t = n.buffers.at("num_batches_tracked");
      EXPECT_EQ(t.dim(), 0) << n.name;
      EXPECT_EQ(t.scalar_type(), at::kLong) << n.name;
      EXPECT_EQ(t.item<int64_t>(), 0) << n.name;
    }
  }
}

// WeightInit::kKaimingNormal: conv weights N(0, 2/fan_in) (He et al., 2015, eq. 10); linear
// layers, biases and BN as torch.nn does. The two draws are told apart by their shape, not only
// their spread: a normal has 68.3 % of its mass within one standard deviation, where the torch
// default (uniform) has 57.7 %, and reaches past √3 standard deviations, where the uniform stops.
TEST_P(ZooModelTest, KaimingNormalDrawsConvWeightsAsHeEtAl) {
  ZooOptions o;
  o.seed = 3;
  o.weight_init = WeightInit::kKaimingNormal;
  Graph g = build_model(GetParam(), o);
  int checked = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != "conv2d" && n.op != "linear") continue;
    const at::Tensor& w = n.params.at("weight");
    const int64_t fan_in = w.numel() / w.size(0);
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    if (const at::Tensor* b = n.params.find("bias")) {
      EXPECT_LE(b->abs().max().item<double>(), bound) << n.name;
    }
    if (n.op == "linear") {
      EXPECT_LE(w.abs().max().item<double>(), bound) << n.name;
      continue;
    }
    EXPECT_TRUE(w.requires_grad()) << n.name;
    if (w.numel() < 2000) continue;  // too few samples for the checks below
    const double sigma = std::sqrt(2.0 / static_cast<double>(fan_in));
    const double n_samples = static_cast<double>(w.numel());
    // Standard errors: σ/√n for the mean, about σ/√(2n) for the standard deviation,
    // √(p(1−p)/n) for the fraction; 5 of each, so the checks hold for any seed's draw, whatever
    // the thread count or instruction set (a uniform draw misses the fraction by 10 or more of them).
    EXPECT_NEAR(w.mean().item<double>(), 0.0, 5 * sigma / std::sqrt(n_samples)) << n.name;
    EXPECT_NEAR(w.std().item<double>(), sigma, 5 * sigma / std::sqrt(2 * n_samples)) << n.name;
    const double within = w.abs().lt(sigma).to(at::kDouble).mean().item<double>();
    EXPECT_NEAR(within, 0.6827, 5 * std::sqrt(0.6827 * 0.3173 / n_samples)) << n.name;
    EXPECT_GT(w.abs().max().item<double>(), std::sqrt(3.0) * sigma) << n.name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
  // The same seed draws the same weights; the default draw differs.
  Graph again = build_model(GetParam(), o);
  o.weight_init = WeightInit::kTorch;
  Graph plain = build_model(GetParam(), o);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op != "conv2d") continue;
    EXPECT_TRUE(n.params.at("weight").equal(again.nodes()[i].params.at("weight"))) << n.name;
    EXPECT_FALSE(n.params.at("weight").equal(plain.nodes()[i].params.at("weight"))) << n.name;
  }
}

TEST_P(ZooModelTest, NumClassesAndInChannelsChangeTheShapes) {
  ZooOptions o;
  o.num_classes = 7;
  o.in_channels = 5;
  Graph g = build_model(GetParam(), o);
  const Shape& in = g.value("input").shape;
  ASSERT_EQ(in.size(), 4u);
  EXPECT_EQ(in[1], 5);
  EXPECT_EQ(g.value(g.outputs()[0]).shape, (Shape{1, 7}));
  // The first node consuming the input is a convolution whose weight takes 5 channels.
  const Node& first = g.node(g.users("input").at(0));
  ASSERT_EQ(first.op, "conv2d");
  EXPECT_EQ(first.params.at("weight").size(1), 5);
  GraphModule m(std::move(g));
  m->eval();
  EXPECT_EQ(m->forward(at::randn({3, 5, in[2], in[3]})).sizes(), (at::IntArrayRef{3, 7}));
}

TEST_P(ZooModelTest, SeedMakesWeightsReproducible) {
  ZooOptions o;
  o.seed = 42;
  at::manual_seed(7);
  Graph a = build_model(GetParam(), o);
  at::Tensor after_build = at::rand({4});
  at::manual_seed(7);
  // A seeded build leaves LibTorch's global generator where it was.
  EXPECT_TRUE(after_build.equal(at::rand({4})));
  Graph b = build_model(GetParam(), o);
  o.seed = 43;
  Graph c = build_model(GetParam(), o);
  bool any_different = false;
  for (size_t i = 0; i < a.nodes().size(); ++i) {
    for (const auto& kv : a.nodes()[i].params) {
      EXPECT_TRUE(kv.second.equal(b.nodes()[i].params.at(kv.first))) << a.nodes()[i].name << "." << kv.first;
      if (!kv.second.equal(c.nodes()[i].params.at(kv.first))) any_different = true;
    }
  }
  EXPECT_TRUE(any_different);
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooModelTest, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

class ZooTest : public test::SeededTest {};

TEST_F(ZooTest, ListsTheNineModels) { EXPECT_EQ(zoo_models(), kModels); }

TEST_F(ZooTest, WeightInitNames) {
  EXPECT_EQ(weight_init_names(), (std::vector<std::string>{"torch", "kaiming_normal"}));
  EXPECT_EQ(weight_init_from_name("torch"), WeightInit::kTorch);
  EXPECT_EQ(weight_init_from_name("kaiming_normal"), WeightInit::kKaimingNormal);
  const std::string what = test::usage_error_message([] { weight_init_from_name("he"); });
  EXPECT_NE(what.find("'he'"), std::string::npos) << what;
  EXPECT_NE(what.find("kaiming_normal"), std::string::npos) << what;
}

TEST_F(ZooTest, UnknownNameThrowsNamingTheKnownModels) {
  try {
    build_model("resnet18");
    FAIL() << "expected whittle::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("resnet18"), std::string::npos) << msg;
    for (const auto& name : kModels) EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
}

TEST_F(ZooTest, BadOptionsThrow) {
  ZooOptions o;
  o.num_classes = 0;
  EXPECT_THROW(build_model("resnet20", o), Error);
  o = {};
  o.in_channels = 0;
  EXPECT_THROW(build_model("resnet20", o), Error);
  o = {};
  o.input_shape = {1, 3, 32};
  EXPECT_THROW(build_model("resnet20", o), Error);
  o = {};
  o.in_channels = 1;
  o.input_shape = {1, 3, 32, 32};
  EXPECT_THROW(build_model("resnet20", o), Error);
  // Too small for LeNet-5's second 5×5 convolution: the error names the node.
  o = {};
  o.input_shape = {1, 1, 8, 8};
  try {
    build_model("lenet5", o);
    FAIL() << "expected whittle::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2"), std::string::npos) << e.what();
  }
}

TEST_F(ZooTest, InputShapeOptionSizesTheClassifier) {
  ZooOptions o;
  o.input_shape = {2, 3, 64, 64};
  Graph g = build_model("vgg_small", o);
  EXPECT_EQ(g.node("fc").params.at("weight").sizes(), (at::IntArrayRef{10, 512 * 8 * 8}));
  EXPECT_EQ(g.value(g.outputs()[0]).shape, (Shape{2, 10}));
  o.input_shape = {1, 1, 32, 32};
  Graph l = build_model("lenet5", o);
  EXPECT_EQ(l.node("fc1").params.at("weight").sizes(), (at::IntArrayRef{120, 16 * 6 * 6}));
  // Global pooling keeps the ResNet classifier at 64 inputs whatever the image size.
  o.input_shape = {1, 3, 64, 64};
  EXPECT_EQ(build_model("resnet20", o).node("linear").params.at("weight").sizes(), (at::IntArrayRef{10, 64}));
}

// ResNet-20 by hand (option B shortcuts, 32×32 input, 10 classes):
//   params: conv1 3·16·9 = 432, bn1 32; layer1: 3 blocks × (2·16·16·9 + 2·32) = 14,016;
//   layer2: block 0 16·32·9 + 32·32·9 + 2·64 + shortcut 16·32 + 64 = 14,528, blocks 1-2 2 × 18,560;
//   layer3: block 0 32·64·9 + 64·64·9 + 2·128 + shortcut 32·64 + 128 = 57,728, blocks 1-2 2 × 73,984;
//   linear 64·10 + 10 = 650; total 272,474 (0.27 M; option A, without the two projections, 269,722).
//   MACs: conv1 32·32·16·27 = 442,368; layer1 6 × 32·32·16·144 = 14,155,776;
//   layer2 16·16·32·(144 + 5·288 + 16) = 13,107,200; layer3 8·8·64·(288 + 5·576 + 32) = 13,107,200;
//   linear 640; total 40,813,184 (option A: 40,551,040, the usual "40.55 M").
TEST_F(ZooTest, ResNet20CountsByHand) {
  NodeCost cost = graph_cost(build_model("resnet20"));
  EXPECT_EQ(cost.params, 272474);
  EXPECT_EQ(cost.macs, 40813184);
  EXPECT_GT(cost.params, 260000);
  EXPECT_LT(cost.params, 280000);
  EXPECT_GT(cost.macs, 40500000);
  EXPECT_LT(cost.macs, 41000000);
  const nlohmann::json info = reference_info("resnet20");
  EXPECT_EQ(cost.params, info["params"].get<int64_t>());
  EXPECT_EQ(cost.macs, info["macs"].get<int64_t>());
}

TEST_F(ZooTest, CudaForwardMatchesCpu) {
  WHITTLE_REQUIRE_CUDA();
  const bool tf32 = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuDNN(false);
  for (const auto& name : kModels) {
    GraphModule m(build_model(name));
    m->eval();
    Shape shape = m->graph().value("input").shape;
    shape[0] = 2;
    at::Tensor x = at::randn(shape);
    at::NoGradGuard no_grad;
    at::Tensor cpu = m->forward(x);
    m->to(torch::kCUDA);
    at::Tensor cuda = m->forward(x.cuda()).cpu();
    const double scale = cpu.abs().max().item<double>();
    EXPECT_TRUE(all_close(cuda, cpu, 1e-4 * scale, 1e-4)) << name;
  }
  at::globalContext().setAllowTF32CuDNN(tf32);
}

}  // namespace
}  // namespace whittle
