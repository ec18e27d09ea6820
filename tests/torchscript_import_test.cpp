// TorchScript import against the TorchScript modules themselves: state_dict names and values,
// eval-mode outputs (batch 2, from graphs imported at batch 1), train mode against the eager
// model's batch-statistics output, gradients, node names, and the error cases.
//
// The modules are written by the torchscript_models fixture (tests/reference/
// make_torchscript_models.py) into ${build}/testdata/torchscript/<name>.pt; <name>.train.pt holds
// a batch-2 input `x` and the eager train-mode output `y` for the models without dropout.

#include <torch/script.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "graph/graph_module.h"
#include "graph/torchscript_import.h"
#include "support.h"

namespace whittle {
namespace {

using test::all_close;

struct ModelCase {
  std::string name;
  Shape shape;  ///< example input shape (batch 1), as traced
};

const std::vector<ModelCase> kModels = {
    {"resnet18", {1, 3, 224, 224}},        {"mobilenet_v2", {1, 3, 224, 224}}, {"vgg11_bn", {1, 3, 224, 224}},
    {"squeezenet1_0", {1, 3, 224, 224}},   {"shufflenet_v2_x0_5", {1, 3, 224, 224}},
    {"densenet121", {1, 3, 224, 224}},     {"scripted_residual", {1, 3, 32, 32}},
    {"tiny_unet", {1, 3, 32, 32}},         {"chunk_mix", {1, 8, 16, 16}},
    {"efficientnet_b0", {1, 3, 224, 224}}, {"regnet_y_400mf", {1, 3, 224, 224}},
    {"googlenet", {1, 3, 224, 224}},       {"mobilenet_v3_small", {1, 3, 224, 224}},
};

std::string model_path(const std::string& name, const std::string& suffix = ".pt") {
  return test::binary_dir() + "/testdata/torchscript/" + name + suffix;
}

std::map<std::string, at::Tensor> tensors(const GraphModule& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m->named_parameters()) out[p.key()] = p.value();
  for (const auto& b : m->named_buffers()) out[b.key() + " (buffer)"] = b.value();
  return out;
}

std::map<std::string, at::Tensor> tensors(const torch::jit::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters(true)) out[p.name] = p.value;
  for (const auto& b : m.named_buffers(true)) out[b.name + " (buffer)"] = b.value;
  return out;
}

template <typename Map>
std::vector<std::string> keys(const Map& m) {
  std::vector<std::string> out;
  for (const auto& kv : m) out.push_back(kv.first);
  return out;
}

// The error message of `f`, which must throw whittle::Error.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected whittle::Error";
  return "";
}

void PrintTo(const ModelCase& mc, std::ostream* os) { *os << mc.name << " " << shape_str(mc.shape); }

class TorchScriptImportTest : public test::SeededTest, public ::testing::WithParamInterface<ModelCase> {};

TEST_P(TorchScriptImportTest, MatchesTheTorchScriptModule) {
  const ModelCase& mc = GetParam();
  const std::string path = model_path(mc.name);
  torch::jit::Module ts = torch::jit::load(path);
  ts.eval();
  GraphModule m(import_torchscript(path, mc.shape));

  // The state_dict has the TorchScript module's keys (sets compared: GraphModule orders tensors by
  // first use in the graph) and the same values; parameters are trainable leaves.
  auto ours = tensors(m);
  auto theirs = tensors(ts);
  ASSERT_EQ(keys(ours), keys(theirs));
  for (const auto& [key, t] : theirs) {
    EXPECT_TRUE(ours[key].equal(t)) << key;
    EXPECT_FALSE(ours[key].is_same(t)) << key << " must be a copy";
  }
  for (const auto& p : m->named_parameters()) EXPECT_TRUE(p.value().requires_grad() && p.value().is_leaf()) << p.key();
  // These forwards call their modules in declaration order, so even the order agrees.
  std::vector<std::string> our_order, their_order;
  for (const auto& p : m->named_parameters()) our_order.push_back(p.key());
  for (const auto& p : ts.named_parameters(true)) their_order.push_back(p.name);
  EXPECT_EQ(our_order, their_order);

  // Eval mode at batch 2 (the graph was imported at batch 1). Both sides call the same ATen kernels
  // in float32 (on this CPU the outputs come out bit-identical), but nothing promises the same
  // kernel choice, in-place/out-of-place variant or summation order on every machine and device;
  // such differences stay around 1e-6 of the output's scale after ~100 layers. Hence rtol 1e-4,
  // and atol 1e-5·max|y| so that elements near zero are judged against the output's scale rather
  // than their own (a relative bound alone fails on cancellations).
  Shape batch2 = mc.shape;
  batch2[0] = 2;
  at::Tensor x = at::randn(batch2);
  at::Tensor expected, actual;
  {
    at::NoGradGuard no_grad;
    expected = ts.forward({x}).toTensor();
    m->eval();
    actual = m->forward(x);
  }
  const double scale = expected.abs().max().item<double>();
  EXPECT_TRUE(all_close(actual, expected, 1e-5 * scale, 1e-4));
  std::printf("[ measure  ] %s eval: max|diff| %.3g, max|y| %.3g\n", mc.name.c_str(),
              (actual - expected).abs().max().item<double>(), scale);

  // Train mode: batch statistics (against the eager model's train-mode output when the fixture
  // wrote one, i.e. for models without dropout), running statistics updated, gradients everywhere.
  m->train();
  at::Tensor xt = x, yt;
  if (std::filesystem::exists(model_path(mc.name, ".train.pt"))) {
    torch::jit::Module ref = torch::jit::load(model_path(mc.name, ".train.pt"));
    xt = ref.attr("x").toTensor();
    yt = ref.attr("y").toTensor();
  }
  at::Tensor out = m->forward(xt);
  if (yt.defined()) {
    // Same tolerances as in eval mode; batch statistics use the same ATen batch_norm kernel.
    const double tscale = yt.abs().max().item<double>();
    EXPECT_TRUE(all_close(out, yt, 1e-5 * tscale, 1e-4));
    std::printf("[ measure  ] %s train: max|diff| %.3g, max|y| %.3g\n", mc.name.c_str(),
                (out - yt).detach().abs().max().item<double>(), tscale);
  }
  int bn_checked = 0;
  for (const auto& b : m->named_buffers()) {
    if (b.key().size() < 20 || b.key().compare(b.key().size() - 20, 20, ".num_batches_tracked") != 0) continue;
    EXPECT_EQ(b.value().item<int64_t>(), theirs[b.key() + " (buffer)"].item<int64_t>() + 1) << b.key();
    const std::string prefix = b.key().substr(0, b.key().size() - 19);
    EXPECT_FALSE(ours[prefix + "running_mean (buffer)"].equal(theirs[prefix + "running_mean (buffer)"])) << prefix;
    ++bn_checked;
  }
  (out * at::randn_like(out)).sum().backward();
  int zero = 0;
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(p.value().grad().isfinite().all().item<bool>()) << p.key();
    if (p.value().grad().abs().sum().item<double>() == 0.0) ++zero;
  }
  EXPECT_EQ(zero, 0) << "parameters with an all-zero gradient";
  int bn_expected = 0;
  for (const auto& kv : theirs) bn_expected += kv.first.find(".num_batches_tracked") != std::string::npos;
  EXPECT_EQ(bn_checked, bn_expected);
}

INSTANTIATE_TEST_SUITE_P(Models, TorchScriptImportTest, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<ModelCase>& info) { return info.param.name; });

class TorchScriptImportNamesTest : public test::SeededTest {};

TEST_F(TorchScriptImportNamesTest, ResNetNodesFollowTheModuleHierarchy) {
  Graph g = import_torchscript(model_path("resnet18"), {1, 3, 224, 224});
  EXPECT_EQ(g.inputs(), std::vector<std::string>{"x"});
  EXPECT_EQ(g.node("conv1").op, "conv2d");
  EXPECT_EQ(g.node("layer1.0.bn1").op, "batch_norm");
  // BasicBlock calls self.relu twice and adds the shortcut in its own forward.
  EXPECT_EQ(g.node("layer1.0.relu").op, "relu");
  EXPECT_EQ(g.node("layer1.0.relu_1").op, "relu");
  EXPECT_EQ(g.node("layer1.0.add").op, "add");
  EXPECT_EQ(g.node("layer2.0.downsample.0").op, "conv2d");
  EXPECT_EQ(g.node("maxpool").op, "max_pool2d");
  EXPECT_EQ(g.node("avgpool").op, "adaptive_avg_pool2d");
  EXPECT_EQ(g.node("flatten").op, "flatten");
  EXPECT_EQ(g.node("fc").op, "linear");
  EXPECT_EQ(g.outputs(), std::vector<std::string>{"fc"});
  EXPECT_EQ(g.value("fc").shape, (Shape{1, 1000}));
  EXPECT_EQ(g.node("layer1.0.add").inputs, (std::vector<std::string>{"layer1.0.bn2", "maxpool"}));
  EXPECT_EQ(g.nodes().size(), 69u);  // 20 conv + 20 BN + 17 ReLU + 8 add + 2 pool + flatten + fc
}

TEST_F(TorchScriptImportNamesTest, ShuffleNetChannelShuffleAndChunks) {
  Graph g = import_torchscript(model_path("shufflenet_v2_x0_5"), {1, 3, 224, 224});
  // view → transpose(1, 2) → view becomes one channel_shuffle named after the block.
  const Node& cs = g.node("stage2.0.channel_shuffle");
  EXPECT_EQ(cs.op, "channel_shuffle");
  EXPECT_EQ(cs.attr_int("groups"), 2);
  EXPECT_EQ(g.node("stage2.1.split").op, "split");  // x.chunk(2, dim=1) in a stride-1 block
  EXPECT_EQ(g.node("stage2.1.split").attr_ints("split_sizes"), (std::vector<int64_t>{24, 24}));
  EXPECT_EQ(g.node("stage2.1.cat").inputs[0], "stage2.1.split:0");
  EXPECT_EQ(g.node("mean").attr_ints("dims"), (std::vector<int64_t>{2, 3}));
  for (const auto& n : g.nodes()) EXPECT_NE(n.op, "transpose") << n.name;

  // Without the rewrite the three ops stay, with the batch-independent reshape.
  TorchScriptImportOptions opts;
  opts.fuse_channel_shuffle = false;
  Graph raw = import_torchscript(model_path("shufflenet_v2_x0_5"), {1, 3, 224, 224}, opts);
  EXPECT_EQ(raw.node("stage2.0.reshape").attr_ints("shape"), (std::vector<int64_t>{2, 24, 28, 28}));
  EXPECT_EQ(raw.node("stage2.0.transpose").op, "transpose");
  EXPECT_EQ(raw.node("stage2.0.reshape_1").attr_ints("shape"), (std::vector<int64_t>{48, 28, 28}));
  GraphModule a(std::move(g)), b(std::move(raw));
  a->eval();
  b->eval();
  at::NoGradGuard no_grad;
  at::Tensor x = at::randn({2, 3, 224, 224});
  EXPECT_TRUE(a->forward(x).equal(b->forward(x)));
}

TEST_F(TorchScriptImportNamesTest, SmallModelsMapTheirOps) {
  Graph s = import_torchscript(model_path("scripted_residual"), {1, 3, 32, 32});
  EXPECT_EQ(s.node("stem.2").op, "relu");
  EXPECT_EQ(s.node("add").op, "add");    // F.relu(y + x)
  EXPECT_EQ(s.node("add_2").op, "add");  // the second loop iteration
  EXPECT_EQ(s.node("relu").op, "relu");
  EXPECT_EQ(s.node("cat").inputs.size(), 3u);
  EXPECT_EQ(s.node("upsample").attr_str("mode"), "nearest");
  EXPECT_EQ(s.node("max_pool2d").op, "max_pool2d");

  Graph u = import_torchscript(model_path("tiny_unet"), {1, 3, 32, 32});
  EXPECT_EQ(u.node("up2").op, "conv_transpose2d");
  EXPECT_EQ(u.node("upsample").attr_str("mode"), "bilinear");
  EXPECT_EQ(u.node("upsample").attr_ints("size"), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(u.node("upsample_1").attr_floats("scale_factor"), (std::vector<double>{2.0, 2.0}));
  EXPECT_EQ(u.node("sigmoid").op, "sigmoid");

  Graph c = import_torchscript(model_path("chunk_mix"), {1, 8, 16, 16});
  EXPECT_EQ(c.node("split").attr_ints("split_sizes"), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(c.node("split_1").attr_ints("split_sizes"), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(c.node("b.2").op, "feature_dropout");
  EXPECT_EQ(c.node("reshape").attr_ints("shape"), (std::vector<int64_t>{-1}));  // h.view(h.size(0), -1)
  EXPECT_EQ(c.node("fc1").op, "linear");  // addmm(bias, x, weight.t())
  EXPECT_EQ(c.node("fc2").op, "linear");  // x.matmul(weight.t()) + bias
  EXPECT_TRUE(c.node("fc2").params.contains("bias"));
  EXPECT_EQ(c.node("c.1").attr_float("negative_slope"), 0.2);
  EXPECT_EQ(c.node("permute").attr_ints("dims"), (std::vector<int64_t>{0, 2, 3, 1}));
}

TEST(TorchScriptImportErrors, UnsupportedOpNamesTheOpAndTheModule) {
  std::string msg = error_of([] { import_torchscript(model_path("unsupported_fft"), {1, 3, 16, 16}); });
  EXPECT_NE(msg.find("unsupported op aten::fft_fft2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("in module 'body.1' of type FFTBlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("make_torchscript_models.py:"), std::string::npos) << msg;  // the source line
  EXPECT_NE(msg.find(model_path("unsupported_fft")), std::string::npos) << msg;
}

TEST(TorchScriptImportErrors, ReshapeThatFixesTheBatchIsRejected) {
  std::string msg = error_of([] { import_torchscript(model_path("fixed_batch"), {1, 3, 8, 8}); });
  EXPECT_NE(msg.find("aten::reshape with leading size 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("batch"), std::string::npos) << msg;
}

TEST(TorchScriptImportErrors, MissingAndForeignFilesNameThePath) {
  const std::string missing = test::binary_dir() + "/testdata/torchscript/no_such_model.pt";
  std::string msg = error_of([&] { import_torchscript(missing, {1, 3, 8, 8}); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;

  const std::string text = test::binary_dir() + "/testdata/torchscript/not_torchscript.pt";
  {
    std::ofstream out(text);
    out << "not a zip archive\n";
  }
  msg = error_of([&] { import_torchscript(text, {1, 3, 8, 8}); });
  std::filesystem::remove(text);
  EXPECT_NE(msg.find(text), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a readable TorchScript archive"), std::string::npos) << msg;
}

// Small modules compiled in C++ (TorchScript source), for the state checks.
torch::jit::Module linear_module(const std::string& name, int64_t in, int64_t out) {
  torch::jit::Module m(name);
  m.register_parameter("weight", at::randn({out, in}), false);
  m.register_parameter("bias", at::randn({out}), false);
  m.define("def forward(self, x):\n  return torch.matmul(x, self.weight.t()) + self.bias\n");
  return m;
}

TEST(TorchScriptImportErrors, UnusedTensorsAreReportedOrSkipped) {
  torch::jit::Module m("Net");
  m.register_module("fc", linear_module("Fc", 4, 3));
  m.register_module("aux", linear_module("Aux", 4, 2));
  m.define("def forward(self, x):\n  return torch.relu(self.fc.forward(x))\n");
  std::string msg = error_of([&] { import_torchscript(m, {1, 4}, {}, "net"); });
  EXPECT_NE(msg.find("aux.weight, aux.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("import_torchscript(net)"), std::string::npos) << msg;

  TorchScriptImportOptions opts;
  opts.allow_unused_tensors = true;
  GraphModule g(import_torchscript(m, {1, 4}, opts));
  EXPECT_EQ(keys(tensors(g)), (std::vector<std::string>{"fc.bias", "fc.weight"}));
  at::Tensor x = at::randn({3, 4});
  EXPECT_TRUE(all_close(g->forward(x), m.forward({x}).toTensor(), 1e-6, 1e-5));
  EXPECT_EQ(g->graph().node("relu").op, "relu");
}

TEST(TorchScriptImportScripted, InPlaceOpsAndBatchFreeViews) {
  // x.view(-1, 4) keeps the batch free; torch.relu_(z) changes z for its later use, but not the
  // tensor z was cloned from.
  torch::jit::Module m("Net");
  m.register_module("fc", linear_module("Fc", 4, 4));
  m.define(
      "def forward(self, x):\n"
      "  y = self.fc.forward(x.view(-1, 4))\n"
      "  z = y.clone()\n"
      "  torch.relu_(z)\n"
      "  return y + z\n");
  GraphModule g(import_torchscript(m, {1, 2, 2}));
  EXPECT_EQ(g->graph().node("reshape").attr_ints("shape"), (std::vector<int64_t>{4}));
  EXPECT_EQ(g->graph().node("identity").op, "identity");
  EXPECT_EQ(g->graph().node("add").inputs, (std::vector<std::string>{"fc", "relu"}));
  at::NoGradGuard no_grad;
  at::Tensor x = at::randn({3, 2, 2});
  EXPECT_TRUE(all_close(g->forward(x), m.forward({x}).toTensor(), 1e-6, 1e-5));
}

TEST(TorchScriptImportErrors, SharedWeightsAreRejected) {
  torch::jit::Module m("Net");
  m.register_module("fc", linear_module("Fc", 4, 4));
  m.define("def forward(self, x):\n  return self.fc.forward(self.fc.forward(x))\n");
  std::string msg = error_of([&] { import_torchscript(m, {1, 4}); });
  EXPECT_NE(msg.find("module 'fc' is called more than once"), std::string::npos) << msg;
}

TEST(TorchScriptImportErrors, AddOfAConstantIsRejected) {
  torch::jit::Module m("Net");
  m.register_module("fc", linear_module("Fc", 4, 4));
  m.define("def forward(self, x):\n  return self.fc.forward(x) + 1.0\n");
  std::string msg = error_of([&] { import_torchscript(m, {1, 4}); });
  EXPECT_NE(msg.find("aten::add"), std::string::npos) << msg;
  EXPECT_NE(msg.find("two computed tensors"), std::string::npos) << msg;
}

}  // namespace
}  // namespace whittle
