// deploy::Model against the GraphModule it is built from: the same logits (float rounding of BN
// folding and of the threshold aside) on BNN and XNOR-Net LeNet-5 and ResNet-20, through a
// checkpoint, and on a trained LeNet-5 BNN over the 2,000 bundled MNIST test digits. Also the
// packed max pooling against ATen's.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <iostream>
#include <limits>

#include "core/error.h"
#include "core/file_util.h"
#include "data/loader.h"
#include "deploy/int8.h"
#include "kernels/int8_conv.h"
#include "kernels/isa.h"
#include "deploy/model.h"
#include "export/checkpoint.h"
#include "fuse/fuse.h"
#include "fuse_test_util.h"
#include "graph/zoo.h"
#include "kernels/bitpack.h"
#include "kernels/isa.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "runner/recipe.h"
#include "runner/trainer.h"
#include "support.h"

namespace whittle::test {
namespace {

class Deploy : public SeededTest {};

// ±1 tensors of x's signs (sign(0) = +1).
at::Tensor signs(const at::Tensor& x) { return at::where(x < 0, -at::ones_like(x), at::ones_like(x)); }

TEST_F(Deploy, MaxPoolOfPackedSignsEqualsAtenMaxPool) {
  for (int64_t c : {1, 63, 64, 65, 130}) {
    for (auto [k, s, p, ceil] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
             {2, 2, 0, false}, {3, 2, 1, false}, {3, 1, 1, false}, {2, 2, 0, true}, {3, 2, 0, true}, {2, 1, 1, true}}) {
      const at::Tensor x = signs(at::randn({2, c, 7, 9}));
      const at::Tensor expected = kernels::pack_signs(at::max_pool2d(x, {k, k}, {s, s}, {p, p}, {1, 1}, ceil));
      const at::Tensor got = kernels::max_pool2d_signs(kernels::pack_signs(x), {k, k, s, s, p, p, ceil});
      ASSERT_EQ(got.sizes(), expected.sizes()) << "C " << c << " k " << k << " s " << s << " p " << p << " ceil " << ceil;
      EXPECT_TRUE(got.equal(expected)) << "C " << c << " k " << k << " s " << s << " p " << p << " ceil " << ceil;
    }
  }
  // Non-square windows.
  const at::Tensor x = signs(at::randn({3, 70, 6, 11}));
  EXPECT_TRUE(kernels::max_pool2d_signs(kernels::pack_signs(x), {2, 3, 2, 1, 1, 0, false})
                  .equal(kernels::pack_signs(at::max_pool2d(x, {2, 3}, {2, 1}, {1, 0}))));
}

TEST_F(Deploy, MaxPoolOfPackedSignsRejectsBadInput) {
  EXPECT_THROW(kernels::max_pool2d_signs(at::zeros({2, 3, 4}, at::kLong), {}), Error);
  EXPECT_THROW(kernels::max_pool2d_signs(at::zeros({1, 4, 4, 1}, at::kFloat), {}), Error);
  EXPECT_THROW(kernels::max_pool2d_signs(at::zeros({1, 4, 4, 1}, at::kLong), {2, 2, 0, 2, 0, 0, false}), Error);
  EXPECT_THROW(kernels::max_pool2d_signs(at::zeros({1, 4, 4, 1}, at::kLong), {2, 2, 2, 2, 2, 2, false}), Error);
  EXPECT_THROW(kernels::max_pool2d_signs(at::zeros({1, 1, 1, 1}, at::kLong), {2, 2, 2, 2, 0, 0, false}), Error);
}

// A zoo model quantized with `method`, BN statistics randomized, in eval form.
Graph quantized(const std::string& model, const std::string& method, Shape input, bool xnor_scale_k = false,
                int64_t weight_bits = 0, int64_t activation_bits = 0) {
  ZooOptions zo;
  zo.input_shape = input;
  zo.seed = 1;
  Graph g = build_model(model, zo);
  randomize_batchnorm(g);
  quantize::Config c;
  c.method = method;
  if (xnor_scale_k) c.options["xnor_scale_k"] = true;
  c.weight_bits = weight_bits;
  c.activation_bits = activation_bits;
  quantize::apply(g, c);
  return g;
}

at::Tensor reference_logits(const Graph& g, const at::Tensor& x) {
  GraphModule m(g.clone());
  return run_eval(m, x);
}

int64_t count_kernel(const deploy::Model& m, const std::string& prefix) {
  int64_t k = 0;
  for (const auto& s : m.steps()) k += s.kernel.rfind(prefix, 0) == 0;
  return k;
}

// Logits agree to 1e-4 relative (of the largest logit) and the predicted classes are the same.
void expect_same_logits(const at::Tensor& got, const at::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  EXPECT_TRUE(all_close(got, expected, 1e-4 * scale, 1e-4));
  EXPECT_TRUE(got.argmax(1).equal(expected.argmax(1)));
}

TEST_F(Deploy, BnnLenet5MatchesGraphModule) {
  const Graph g = quantized("lenet5", "bnn", {1, 1, 28, 28});
  const deploy::Model model(g);
  // conv2 (+ bn2's threshold), fc1 (reading the packed map of pool2) and fc2 run on the kernels.
  EXPECT_EQ(model.num_packed_layers(), 3);
  EXPECT_EQ(count_kernel(model, "binary_conv2d + threshold"), 1);
  EXPECT_EQ(count_kernel(model, "binary_linear (as a convolution over the map) + threshold"), 1);
  // pool1 (after conv1's folded BN and the binarizer) and pool2 (after conv2's threshold).
  EXPECT_EQ(count_kernel(model, "max_pool2d_signs"), 2);
  const at::Tensor x = at::randn({16, 1, 28, 28});
  expect_same_logits(model.forward(x), reference_logits(g, x));
  // Another batch size than the graph's declared one.
  const at::Tensor x1 = at::randn({1, 1, 28, 28});
  expect_same_logits(model.forward(x1), reference_logits(g, x1));
}

TEST_F(Deploy, FloatExecutionRunsNoKernel) {
  const Graph g = quantized("lenet5", "bnn", {1, 1, 28, 28});
  const deploy::Model model(g, deploy::Options{false});
  EXPECT_EQ(model.num_packed_layers(), 0);
  EXPECT_EQ(count_kernel(model, "aten "), static_cast<int64_t>(model.steps().size()));
  const at::Tensor x = at::randn({4, 1, 28, 28});
  expect_same_logits(model.forward(x), reference_logits(g, x));
}

TEST_F(Deploy, XnorLenet5WithAndWithoutKScaling) {
  for (bool k : {false, true}) {
    const Graph g = quantized("lenet5", "xnor", {1, 1, 28, 28}, k);
    const deploy::Model model(g);
    EXPECT_EQ(model.num_packed_layers(), 3) << "K scaling " << k;
    const at::Tensor x = at::randn({8, 1, 28, 28});
    expect_same_logits(model.forward(x), reference_logits(g, x));
  }
}

TEST_F(Deploy, BnnAndXnorResnet20MatchGraphModule) {
  for (const std::string method : {"bnn", "xnor"}) {
    const Graph g = quantized("resnet20", method, {1, 3, 32, 32});
    const deploy::Model model(g);
    // Every convolution but the stem runs binary: 18 3×3 (and the 1×1 shortcuts when the zoo has them).
    EXPECT_GE(model.num_packed_layers(), 18) << method;
    // The BN after each block's second convolution (it feeds the residual add) and after the two 1×1
    // shortcut convolutions folds into their epilogues: 9 + 2.
    EXPECT_EQ(count_kernel(model, "binary_conv2d + batch_norm"), 11) << method;
    const at::Tensor x = at::randn({4, 3, 32, 32});
    expect_same_logits(model.forward(x), reference_logits(g, x));
  }
}

TEST_F(Deploy, WideCodesAndFloatActivationsRunThroughAten) {
  // DoReFa W8A8 and W4A4 (64 and 16 plane pairs), TWN with float activations: no packed layer;
  // LeNet-5 W2A2: conv2 has 6 input channels, and linear layers stay float.
  for (auto [method, wb, ab] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"dorefa", 8, 8}, {"dorefa", 4, 4}, {"twn", 2, 32}, {"dorefa", 2, 2}}) {
    const Graph g = quantized("lenet5", method, {1, 1, 28, 28}, false, wb, ab);
    const deploy::Model model(g);
    EXPECT_EQ(model.num_packed_layers(), 0) << method << " W" << wb << "A" << ab;
    const at::Tensor x = at::randn({4, 1, 28, 28});
    expect_same_logits(model.forward(x), reference_logits(g, x));
  }
}

TEST_F(Deploy, TwoBitCodesRunOnBitplaneKernels) {
  // DoReFa W2A2 (2 x 2 planes), TWN with 2-bit activations (w+, w- x 2), DoReFa W1A2 (1 x 2).
  for (auto [method, wb, ab] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"dorefa", 2, 2}, {"twn", 2, 2}, {"dorefa", 1, 2}}) {
    const Graph g = quantized("resnet20", method, {1, 3, 32, 32}, false, wb, ab);
    // The bit-plane path needs AVX-512 (elsewhere the float convolution is faster): test it there,
    // and on other CPUs that the model still computes the same.
    const bool avx512 = kernels::active_isa() == kernels::Isa::kAvx512;
    const deploy::Model model(g);
    // Convolutions with at least 64 input channels: layer3's but its first (32 inputs) and the
    // shortcut (32).
    EXPECT_EQ(model.num_packed_layers(), avx512 ? 5 : 0) << method << " W" << wb << "A" << ab;
    // Every BN after a bit-plane layer folds into its epilogue.
    EXPECT_EQ(count_kernel(model, "bitplane_conv2d"), avx512 ? 5 : 0);
    for (const auto& s : model.steps()) {
      if (s.kernel.rfind("bitplane_", 0) == 0) {
        EXPECT_NE(s.kernel.find("+ batch_norm"), std::string::npos) << s.kernel;
      }
    }
    const at::Tensor x = at::randn({4, 3, 32, 32});
    expect_same_logits(model.forward(x), reference_logits(g, x));
  }
}

// int8 (whole network) of BN-folded ResNet-20 and LeNet-5, calibrated with min-max on random
// batches: every convolution and the residual adds joining them run on integer kernels (whittle's
// own for each vector instruction set, kernels/int8_conv.h), requantizing to the next quantizer's
// grid; the classifier (float logits) on the same kernels with float output; the last add (read by
// the ReLU before the float pooling) runs in float on dequantized values. The integer
// requantization lands a code one level apart from the graph's float rounding now and then:
// logits within 3 % of the largest (measured: 1.2 % on the trained ResNet-20, whittle bench). The
// integer sums do not depend on the thread count or the instruction set (the variants write the same
// codes, int8_kernels_test); without integer kernels the model runs in float (exact), so the margin
// of 2.5x covers other calibrated ranges, not other machines.
TEST_F(Deploy, Int8ModelsRunOnIntegerKernels) {
  struct Case {
    std::string model;
    Shape input;
    int64_t convs, adds, linears, pools;
  };
  // The classifiers (float logits) run on the int8 kernels with float output.
  for (const Case& c : {Case{"resnet20", {1, 3, 32, 32}, 21, 8, 1, 0}, Case{"lenet5", {1, 1, 28, 28}, 2, 0, 3, 2}}) {
    SCOPED_TRACE(c.model);
    ZooOptions zo;
    zo.input_shape = c.input;
    zo.seed = 1;
    Graph g = build_model(c.model, zo);
    randomize_batchnorm(g);
    fuse::fuse_for_inference(g);
    GraphModule m(std::move(g));
    quantize::Config q;
    q.method = "int8";
    q.options["calibration_batches"] = int64_t{2};
    const quantize::Report r = quantize::apply(m, q);
    m->eval();
    Shape batch_shape = c.input;
    batch_shape[0] = 16;
    const std::vector<at::Tensor> batches = {at::randn(batch_shape), at::randn(batch_shape)};
    quantize::calibrate_learned(m, [&](int64_t i) { return batches.at(static_cast<size_t>(i)); },
                                *quantize::quantizer_method("int8").calibration(quantize::resolve(q)),
                                quantize::nodes_to_initialize(m->graph(), r));
    const at::Tensor x = at::randn(batch_shape);
    const at::Tensor expected = reference_logits(m->graph(), x);
    // Each instruction set: whittle's int8 kernels where it has a vector variant (AVX2, AVX-512
    // VNNI), else LibTorch's quantized engine where fbgemm sums exactly (VNNI), else float.
    for (kernels::Isa isa : kernels::supported_isas()) {
      SCOPED_TRACE(kernels::isa_name(isa));
      struct IsaScope {
        kernels::Isa saved = kernels::active_isa();
        ~IsaScope() { kernels::set_isa(saved); }
      } scope;
      kernels::set_isa(isa);
      const deploy::Model model(m->graph());
      const at::Tensor got = model.forward(x);
      const bool own = kernels::int8_variant_supported(kernels::Int8Variant::kAvx2) && isa != kernels::Isa::kScalar;
      const int64_t k = own || deploy::fbgemm_exact() ? 1 : 0;
      EXPECT_EQ(count_kernel(model, "int8 conv2d"), k * c.convs);
      EXPECT_EQ(count_kernel(model, "int8 add"), (own ? 1 : 0) * c.adds);
      EXPECT_EQ(count_kernel(model, "int8 linear"), (own ? 1 : 0) * c.linears);
      EXPECT_EQ(count_kernel(model, "int8 max_pool2d"), k * c.pools);
      const double diff = (got - expected).abs().max().item<double>();
      EXPECT_LE(diff, 0.03 * expected.abs().max().item<double>());
    }
    // An input of another channel count is named, not read past its end.
    if (deploy::int8_kernels_available()) {
      Shape wrong = batch_shape;
      wrong[1] += 1;
      const deploy::Model model(m->graph());
      try {
        model.forward(at::randn(wrong));
        ADD_FAILURE() << "an input of " << wrong[1] << " channels ran";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("input channels got codes of shape"), std::string::npos) << e.what();
      }
    }
  }
}

TEST_F(Deploy, LoadsAPackedCheckpoint) {
  const Graph g = quantized("lenet5", "bnn", {1, 1, 28, 28});
  const std::string dir = join_path(binary_dir(), "testdata/deploy");
  make_directories(dir);
  const std::string path = join_path(dir, "lenet5_bnn.h5");
  save_checkpoint(path, quantize::pack_graph(g));
  const deploy::Model model = deploy::Model::load(path);
  EXPECT_EQ(model.num_packed_layers(), 3);
  // Binary layers keep packed codes: no float weight in the graph the model runs.
  for (const std::string layer : {"conv2", "fc1", "fc2"})
    EXPECT_FALSE(model.graph().node(layer).params.contains("weight")) << layer;
  const at::Tensor x = at::randn({8, 1, 28, 28});
  expect_same_logits(model.forward(x), reference_logits(load_checkpoint(path).graph, x));
}

TEST_F(Deploy, BadInputIsReported) {
  const deploy::Model model(quantized("lenet5", "bnn", {1, 1, 28, 28}));
  EXPECT_THROW(model.forward(std::vector<at::Tensor>{}), Error);
  try {
    model.forward(at::randn({2, 3, 28, 28}));  // 3 channels into a 1-channel conv
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'conv1'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("frame #"), std::string::npos) << e.what();
  }
  EXPECT_THROW(deploy::Model::load(join_path(binary_dir(), "testdata/deploy/missing.h5")), Error);
  // A 32x32 input makes pool2's map 6x6; fc1 reads the flatten of a 5x5 one.
  try {
    model.forward(at::randn({1, 1, 32, 32}));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc1'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[16, 5, 5] map"), std::string::npos) << e.what();
  }
  // A packed layer without its codes: the error names the layer while the model is built.
  Graph broken = quantize::pack_graph(quantized("lenet5", "bnn", {1, 1, 28, 28}));
  broken.node("conv2").buffers.erase("weight_codes");
  try {
    deploy::Model m(broken);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'conv2'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("weight_codes"), std::string::npos) << e.what();
  }
}

// NaN binarizes to −1 on both paths (quantize::bnn_sign tests x ≥ 0; so does pack_signs).
TEST_F(Deploy, NanBinarizesAsTheTrainingGraphDoes) {
  const Graph g = quantized("lenet5", "bnn", {1, 1, 28, 28});
  const deploy::Model model(g);
  at::Tensor x = at::randn({2, 1, 28, 28});
  x[0][0][5][5] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor got = model.forward(x), expected = reference_logits(g, x);
  EXPECT_TRUE(all_close(got, expected, 1e-4 * expected.abs().nan_to_num(0).max().item<double>(), 1e-4));
}

// A LeNet-5 BNN trained for one epoch on 2,048 digits, evaluated on the 2,000 test digits both
// ways: the same predictions, logits within 1e-4 relative.
TEST_F(Deploy, TrainedBnnLenet5HasTheSameTop1OnMnist) {
  ASSERT_EQ(::chdir(source_dir().c_str()), 0);  // the recipe's data paths are relative to the source tree
  const std::string out = join_path(binary_dir(), "testdata/deploy/lenet5_bnn_run");
  remove_tree(out);
  runner::Recipe r = runner::load_recipe(join_path(source_dir(), "recipes/mnist/lenet5_bnn.yaml"),
                                         {"training.epochs=1", "data.train_limit=2048", "data.num_workers=1"});
  runner::RunOptions opt;
  opt.out_dir = out;
  std::ostringstream log;
  opt.log = &log;
  runner::run_recipe(r, opt);
  const std::string path = join_path(out, "model.h5");
  const deploy::Model model = deploy::Model::load(path);
  EXPECT_EQ(model.num_packed_layers(), 3);
  GraphModule reference(load_checkpoint(path).graph);
  reference->eval();
  data::LoaderOptions lo;
  lo.batch_size = 500;
  lo.shuffle = false;
  lo.transform.mean = {0.1307};
  lo.transform.stddev = {0.3081};
  data::DataLoader loader(runner::load_split(join_path(source_dir(), "data/mnist10k"), "t10k", "", log), lo);
  int64_t hits_deploy = 0, hits_reference = 0, samples = 0;
  at::NoGradGuard no_grad;
  for (auto& batch : loader) {
    const at::Tensor expected = reference->forward(batch.images);
    const at::Tensor got = model.forward(batch.images);
    expect_same_logits(got, expected);
    hits_deploy += got.argmax(1).eq(batch.labels).sum().item<int64_t>();
    hits_reference += expected.argmax(1).eq(batch.labels).sum().item<int64_t>();
    samples += batch.labels.size(0);
  }
  EXPECT_EQ(samples, 2000);
  EXPECT_EQ(hits_deploy, hits_reference);
  // Floor 80 %: measured 85.10 % (2 threads, AVX-512), 86.00 % (OMP_NUM_THREADS=1), 86.20 % (one
  // thread, ATEN_CPU_CAPABILITY=default, WHITTLE_KERNEL_ISA=avx2), 84.80 % (ATen avx2, scalar
  // kernels): a margin of 4.8 points for other thread counts and instruction sets. The equality
  // of the two top-1 counts holds on all four.
  EXPECT_GT(hits_reference, 1600) << "the one-epoch model should reach 80 %";
  std::cout << "trained LeNet-5 BNN: top-1 " << hits_reference << " / " << samples << "\n";
}

}  // namespace
}  // namespace whittle::test
