// The learned quantizers: LSQ (Esser et al. 2020) and PACT (Choi et al. 2018). Values and gradients
// worked out by hand in the comments, the degenerate cases (an all-zero tensor, a step driven to 0
// or below, bits 1 and 8), packed codes that decode bitwise to the forward's values, and the
// methods through the quantize pass (learned parameters, their role, initialization from a batch,
// the step floor after an optimizer step, PACT's penalty). Every bound below holds with 1 and 2
// intra-op threads, ATEN_CPU_CAPABILITY=default and WHITTLE_KERNEL_ISA=scalar (checked): the values
// are exact divisions and roundings, and the gradient sums' bounds are relative to their terms.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "core/error.h"
#include "core/file_util.h"
#include "core/isa.h"
#include "export/checkpoint.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "graph/zoo.h"
#include "quantize/lsq.h"
#include "quantize/method.h"
#include "quantize/quantize.h"
#include "runner/report.h"
#include "support.h"

namespace whittle::test {
namespace {

namespace q = whittle::quantize;

at::Tensor vec(std::vector<float> v) { return at::tensor(v, at::TensorOptions().dtype(at::kFloat)); }

void expect_close(const at::Tensor& got, std::vector<float> want, double tol = 1e-6) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << got;
  const at::Tensor g = got.detach().to(at::kFloat).reshape({-1});
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(g[static_cast<int64_t>(i)].item<double>(), want[i], tol) << "element " << i << " of " << got;
}

// 2-bit signed grid [−2, 1], s = 0.5: x = [−3, −0.6, 0.2, 0.5, 1.26, 5] → v = x/s = [−6, −1.2,
// 0.4, 1, 2.52, 10] → round(clamp(v, −2, 1)) = [−2, −1, 0, 1, 1, 1] → x̂ = [−1, −0.5, 0, 0.5, 0.5,
// 0.5]. Inside (−2 < v < 1): elements 1 and 2 only (v = 1 is on the bound: outside). With the
// upstream gradient [1, 2, 3, 4, 5, 6]: ∂/∂x = [0, 2, 3, 0, 0, 0]; ∂/∂s per element = [−2 (below),
// round(−1.2) + 1.2 = 0.2, 0 − 0.4 = −0.4, 1, 1, 1 (at or above)], weighted: −2 + 0.4 − 1.2 + 4 +
// 5 + 6 = 12.2, times g = 1/√(6·1). The elements outside the range count with their own upstream
// gradient (the step gradient is not built from the masked input gradient).
TEST(Lsq, ValuesAndGradientsByHand) {
  const at::Tensor x = vec({-3.0f, -0.6f, 0.2f, 0.5f, 1.26f, 5.0f}).set_requires_grad(true);
  const at::Tensor s = vec({0.5f}).set_requires_grad(true);
  const q::LsqGrid grid = q::lsq_signed_grid(2);
  EXPECT_EQ(grid.q_n, 2);
  EXPECT_EQ(grid.q_p, 1);
  const double g = q::lsq_gradient_scale(6, grid.q_p);
  EXPECT_DOUBLE_EQ(g, 1.0 / std::sqrt(6.0));
  const at::Tensor y = q::lsq_quantize(x, s, grid, g);
  expect_close(y, {-1.0f, -0.5f, 0.0f, 0.5f, 0.5f, 0.5f}, 0);
  y.backward(vec({1, 2, 3, 4, 5, 6}));
  expect_close(x.grad(), {0, 2, 3, 0, 0, 0}, 0);
  expect_close(s.grad(), {static_cast<float>(12.2 / std::sqrt(6.0))}, 1e-5);
}

// Per channel along axis 0, grid [−2, 1], gradient scale 1. Row 0, s = 0.5: x = [0.3, −1.1, 0.7] →
// v = [0.6, −2.2, 1.4] → [1, −2, 1] → x̂ = [0.5, −1, 0.5]; inside only 0.6; ∂/∂s = 0.4 − 2 + 1 =
// −0.6. Row 1, s = 1: v = [0.3, −1.1, 0.7] → [0, −1, 1] → x̂ = [0, −1, 1], all inside; ∂/∂s = −0.3
// + 0.1 + 0.3 = 0.1.
TEST(Lsq, PerChannelStepsTakeTheirChannelsGradients) {
  const at::Tensor x = vec({0.3f, -1.1f, 0.7f, 0.3f, -1.1f, 0.7f}).reshape({2, 3}).set_requires_grad(true);
  const at::Tensor s = vec({0.5f, 1.0f}).set_requires_grad(true);
  const at::Tensor y = q::lsq_quantize(x, s, q::lsq_signed_grid(2), 1.0, 0);
  expect_close(y, {0.5f, -1.0f, 0.5f, 0.0f, -1.0f, 1.0f}, 0);
  y.backward(at::ones_like(y));
  expect_close(x.grad(), {1, 0, 0, 1, 1, 1}, 0);
  expect_close(s.grad(), {-0.6f, 0.1f}, 1e-6);
  // A step of the wrong size is named.
  EXPECT_THROW(q::lsq_quantize(x, vec({1, 1, 1}), q::lsq_signed_grid(2), 1.0, 0), Error);
}

// Unsigned activations, 2 bits: grid [0, 3], s = 0.25, x = [−1, 0, 0.1, 0.3, 2]: v = [−4, 0, 0.4,
// 1.2, 8] → [0, 0, 0, 1, 3] → x̂ = [0, 0, 0, 0.25, 0.75]. Inside (0 < v < 3): 0.4 and 1.2; v = 0
// is on the lower bound, so the gradient there is 0, as a ReLU's. ∂/∂s = 0 + 0 − 0.4 − 0.2 + 3 = 2.4.
TEST(Lsq, UnsignedActivationGrid) {
  const at::Tensor x = vec({-1.0f, 0.0f, 0.1f, 0.3f, 2.0f}).set_requires_grad(true);
  const at::Tensor s = vec({0.25f}).set_requires_grad(true);
  const q::LsqGrid grid = q::lsq_unsigned_grid(2);
  EXPECT_EQ(grid.q_n, 0);
  EXPECT_EQ(grid.q_p, 3);
  const at::Tensor y = q::lsq_quantize(x, s, grid, 1.0);
  expect_close(y, {0, 0, 0, 0.25f, 0.75f}, 0);
  y.backward(at::ones_like(y));
  expect_close(x.grad(), {0, 0, 1, 1, 0}, 0);
  expect_close(s.grad(), {2.4f}, 1e-6);
  // The initial step: 2·mean|x|/√Q_P = 2·(3.4/5)/√3.
  expect_close(q::lsq_initial_step(x, grid), {static_cast<float>(2 * 0.68 / std::sqrt(3.0))}, 1e-6);
}

TEST(Lsq, DegenerateCases) {
  // An all-zero tensor: the initial step is the floor, the values are 0 and the gradients finite.
  const at::Tensor zeros = at::zeros({4, 3}).set_requires_grad(true);
  const at::Tensor s0 = q::lsq_initial_step(zeros, q::lsq_signed_grid(4)).set_requires_grad(true);
  expect_close(s0, {1e-8f}, 0);
  at::Tensor y = q::lsq_quantize(zeros, s0, q::lsq_signed_grid(4), q::lsq_gradient_scale(12, 7));
  EXPECT_TRUE(at::equal(y, at::zeros({4, 3})));
  y.sum().backward();
  EXPECT_TRUE(at::isfinite(zeros.grad()).all().item<bool>());
  EXPECT_TRUE(at::isfinite(s0.grad()).all().item<bool>());

  // A step driven below 0 quantizes with the floor (1e-8): x = 1e-8·[−3, 0.4, 5] on the 2-bit grid
  // gives 1e-8·[−2, 0, 1], and its gradient still reaches the step (−2 + (0 − 0.4) + 1 = −1.4).
  const at::Tensor x = (vec({-3.0f, 0.4f, 5.0f}) * 1e-8).set_requires_grad(true);
  const at::Tensor neg = vec({-0.3f}).set_requires_grad(true);
  y = q::lsq_quantize(x, neg, q::lsq_signed_grid(2), 1.0);
  expect_close(y / 1e-8, {-2, 0, 1}, 1e-5);
  y.sum().backward();
  expect_close(neg.grad(), {-1.4f}, 1e-5);

  // Bits: weights 2..8 (1 bit would leave the signed grid {−1, 0}), activations 1..8.
  EXPECT_THROW(q::lsq_signed_grid(1), Error);
  EXPECT_THROW(q::lsq_signed_grid(9), Error);
  EXPECT_THROW(q::lsq_unsigned_grid(0), Error);
  const q::LsqGrid one = q::lsq_unsigned_grid(1);
  EXPECT_EQ(one.q_p, 1);  // {0, s}
  expect_close(q::lsq_quantize(vec({-1, 0.4f, 0.6f, 9}), vec({1}), one, 1.0), {0, 0, 1, 1}, 0);
  // 8 bits: the signed grid reaches −128 and 127.
  const q::LsqGrid eight = q::lsq_signed_grid(8);
  EXPECT_EQ(eight.q_n, 128);
  EXPECT_EQ(eight.q_p, 127);
  expect_close(q::lsq_quantize(vec({-1000, -127.5f, 126.5f, 1000}), vec({1}), eight, 1.0), {-128, -128, 126, 127}, 0);
}

// The packed codes decode (Encoding::kUniform) to bitwise the forward's values, per tensor and per
// output channel, at 2, 4 and 8 bits, in float32 and float64.
TEST(Lsq, CodesDecodeBitwiseToTheForward) {
  at::manual_seed(3);
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor w = at::randn({6, 4, 3, 3}, at::TensorOptions().dtype(dtype));
    for (int64_t bits : {2, 4, 8}) {
      const q::LsqGrid grid = q::lsq_signed_grid(bits);
      for (bool per_channel : {false, true}) {
        const at::Tensor step = q::lsq_initial_step(w, grid, per_channel, 0) * 1.3;
        const at::Tensor y = q::lsq_quantize(w, step, grid, 1.0, 0);
        const q::EncodedWeight e = q::lsq_encode(w, step, bits, 0);
        EXPECT_EQ(e.encoding, q::Encoding::kUniform);
        EXPECT_GE(e.codes.min().item<double>(), 0);
        EXPECT_LE(e.codes.max().item<double>(), (1 << bits) - 1);
        const at::Tensor decoded = q::decode_weight(e.codes, e.scale, e.encoding, e.bits, e.axis, dtype);
        EXPECT_TRUE(at::equal(decoded, y)) << bits << " bits, per_channel " << per_channel << ", " << dtype;
      }
    }
  }
}

// LSQ+, 2 bits (grid [0, 3]), β = −0.5, s = 0.5: x = [−1, −0.2, 0.3, 2] → (x − β)/s = [−1, 0.6,
// 1.6, 5] → round(clamp(·, 0, 3)) = [0, 1, 2, 3] → x̂ = [0, 0.5, 1, 1.5] + β = [−0.5, 0, 0.5, 1].
// Inside (0 < v < 3): the middle two. ∂/∂s = 0 + 0.4 + 0.4 + 3 = 3.8; ∂/∂β = 1 at each element
// outside: 2 (gradient scale 1).
TEST(LsqPlus, ValuesAndGradientsByHand) {
  const at::Tensor x = vec({-1.0f, -0.2f, 0.3f, 2.0f}).set_requires_grad(true);
  const at::Tensor s = vec({0.5f}).set_requires_grad(true);
  const at::Tensor b = vec({-0.5f}).set_requires_grad(true);
  const at::Tensor y = q::lsq_quantize(x, s, q::lsq_unsigned_grid(2), 1.0, 0, b);
  expect_close(y, {-0.5f, 0, 0.5f, 1}, 1e-7);
  y.sum().backward();
  expect_close(x.grad(), {0, 1, 1, 0}, 0);
  expect_close(s.grad(), {3.8f}, 1e-6);
  expect_close(b.grad(), {2}, 0);
  EXPECT_THROW(q::lsq_quantize(x, s, q::lsq_unsigned_grid(2), 1.0, 0, vec({0, 0})), Error);
}

// The method on LeNet-5: an offset on the inputs that no ReLU feeds directly (conv2 and fc1 read
// pooled and flattened values), none on fc2's input, which stands for its ReLU (relu = 1).
// initialize_learned sets each offset to its input's minimum and the step from the rest.
TEST(LsqPlus, OffsetsWhereNoReluStandsIn) {
  at::manual_seed(2);
  GraphModule m(build_model("lenet5", ZooOptions{}));
  q::Config c;
  c.method = "lsq_plus";
  q::apply(m, c);
  int64_t with_offset = 0, without = 0;
  for (const Node& n : m->graph().nodes()) {
    if (n.op != "act_quant") continue;
    EXPECT_EQ(n.attr_str("method"), "lsq_plus");
    if (n.params.contains("act_offset")) {
      EXPECT_FALSE(n.attr_bool("relu")) << n.name;
      EXPECT_EQ(param_role(n, "act_offset"), ParamRole::kQuantizer);
      ++with_offset;
    } else {
      EXPECT_TRUE(n.attr_bool("relu")) << n.name;
      ++without;
    }
  }
  EXPECT_EQ(with_offset, 2);
  EXPECT_EQ(without, 1);
  m->train();
  EXPECT_EQ(q::initialize_learned(m, at::randn({8, 1, 28, 28})), 3);
  // The inputs are pooled ReLU outputs: their minimum is 0 here.
  for (const Node& n : m->graph().nodes())
    if (n.params.contains("act_offset")) EXPECT_GE(n.params.at("act_offset").item<double>(), 0) << n.name;
}

// PACT, 2 bits, α = 2: s = 2/3; x = [−1, 0, 0.5, 1, 1.9, 3] → min(max(x, 0), 2)/s = [0, 0, 0.75,
// 1.5, 2.85, 3] → round half to even [0, 0, 1, 2, 3, 3] → y = [0, 0, 2/3, 4/3, 2, 2]. ∂/∂x = 1 on
// [0, α): [0, 1, 1, 1, 1, 0]; ∂/∂α = 1 where x ≥ α: with the upstream gradient [1..6], 6.
TEST(Pact, ValuesAndGradientsByHand) {
  GraphModule m(build_model("lenet5", ZooOptions{}));
  q::Config c;
  c.method = "pact";
  c.weight_bits = 2;
  c.activation_bits = 2;
  c.options["clip_init"] = 2.0;
  q::apply(m, c);
  const Node* act = nullptr;
  for (const Node& n : m->graph().nodes())
    if (n.op == "act_quant") act = &n;
  ASSERT_NE(act, nullptr);
  EXPECT_EQ(param_role(*act, "act_clip"), ParamRole::kQuantizer);
  const q::ActivationQuantizer& aq = q::activation_quantizer_of(*act);
  const at::Tensor x = vec({-1, 0, 0.5f, 1, 1.9f, 3}).set_requires_grad(true);
  Node probe = *act;
  probe.attrs["relu"] = int64_t{0};
  const at::Tensor y = aq.forward(probe, x, true);
  expect_close(y, {0, 0, 2.0f / 3, 4.0f / 3, 2, 2}, 1e-6);
  y.backward(vec({1, 2, 3, 4, 5, 6}));
  expect_close(x.grad(), {0, 2, 3, 4, 5, 0}, 0);
  expect_close(act->params.at("act_clip").grad(), {6}, 0);
  // Standing for a ReLU too: the gradient at x = 0 is ReLU's, 0.
  probe.attrs["relu"] = int64_t{1};
  const at::Tensor x2 = vec({0, 0.5f}).set_requires_grad(true);
  aq.forward(probe, x2, true).sum().backward();
  expect_close(x2.grad(), {0, 1}, 0);
  // The grid its outputs lie on: max α, 2 bits.
  EXPECT_DOUBLE_EQ(aq.grid(*act).max, 2.0);
  EXPECT_EQ(aq.grid(*act).bits, 2);
}

// PACT's penalty λ·Σα² over the clip levels of the quantized inputs (LeNet-5: conv2, fc1 and fc2's
// inputs); none without clip_penalty.
TEST(Pact, PenaltyIsLambdaTimesTheSquaredClips) {
  Graph g = build_model("lenet5", ZooOptions{});
  q::Config c;
  c.method = "pact";
  c.options["clip_init"] = 3.0;
  q::apply(g, c);
  int64_t clips = 0;
  for (const Node& n : g.nodes()) clips += n.op == "act_quant" && n.params.contains("act_clip");
  EXPECT_EQ(clips, 3);
  EXPECT_FALSE(q::penalty(g, q::resolve(c)).defined());
  c.options["clip_penalty"] = 0.01;
  expect_close(q::penalty(g, q::resolve(c)).reshape({1}), {static_cast<float>(0.01 * 3 * 9.0)}, 1e-6);
}

// LSQ through the quantize pass on LeNet-5: learned steps on the layers and their inputs, as
// quantizer parameters (no weight decay); the activation steps set from a batch without changing
// the batch-norm statistics; after an optimizer step a step driven below 0 comes back to the
// floor; the packed checkpoint reloads to bitwise the same outputs.
TEST(Lsq, MethodTrainsInitializesAndPacks) {
  at::manual_seed(1);
  GraphModule m(build_model("lenet5", ZooOptions{}));
  q::Config c;
  c.method = "lsq";
  c.weight_bits = 2;
  c.activation_bits = 3;
  c.options["granularity"] = std::string("per_channel");
  const q::Report r = q::apply(m, c);
  EXPECT_EQ(r.quantized, (std::vector<std::string>{"conv2", "fc1", "fc2"}));
  const Node& conv2 = m->graph().node("conv2");
  EXPECT_EQ(conv2.params.at("weight_step").numel(), 16);  // one per output channel
  EXPECT_EQ(param_role(conv2, "weight_step"), ParamRole::kQuantizer);
  std::vector<std::string> acts;
  for (const Node& n : m->graph().nodes())
    if (n.op == "act_quant") {
      acts.push_back(n.name);
      EXPECT_EQ(param_role(n, "act_step"), ParamRole::kQuantizer);
      expect_close(n.params.at("act_step"), {static_cast<float>(1 / std::sqrt(7.0))}, 1e-7);
    }
  ASSERT_EQ(acts.size(), 3u);

  // Initialization from a batch: the steps move, the running statistics stay.
  std::vector<at::Tensor> before;
  for (const auto& b : m->named_buffers()) before.push_back(b.value().clone());
  m->train();
  const at::Tensor batch = at::randn({32, 1, 28, 28});
  EXPECT_EQ(q::initialize_learned(m, batch), 3);
  size_t i = 0;
  for (const auto& b : m->named_buffers()) EXPECT_TRUE(at::equal(b.value(), before[i++])) << b.key();
  for (const auto& name : acts) {
    const double s = m->graph().node(name).params.at("act_step").item<double>();
    EXPECT_GT(s, 0);
    EXPECT_NE(s, 1 / std::sqrt(7.0)) << name;
  }

  // Given nodes, only those are set: a second entry leaves what the first learned.
  {
    at::NoGradGuard no_grad;
    m->graph().node(acts[0]).params.at("act_step").fill_(0.125);
    m->graph().node(acts[1]).params.at("act_step").fill_(0.25);
  }
  EXPECT_EQ(q::initialize_learned(m, batch, {acts[1]}), 1);
  EXPECT_EQ(m->graph().node(acts[0]).params.at("act_step").item<double>(), 0.125);
  EXPECT_NE(m->graph().node(acts[1]).params.at("act_step").item<double>(), 0.25);
  std::vector<std::string> made = q::nodes_to_initialize(m->graph(), r), sorted_acts = acts;
  std::sort(made.begin(), made.end());
  std::sort(sorted_acts.begin(), sorted_acts.end());
  EXPECT_EQ(made, sorted_acts);  // what the apply above made

  // Two SGD steps: the steps learn.
  const at::Tensor w_step0 = conv2.params.at("weight_step").detach().clone();
  std::vector<at::Tensor> params;
  for (const auto& p : m->parameters()) params.push_back(p);
  for (int step = 0; step < 2; ++step) {
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    m->forward(batch).logsumexp(1).mean().backward();
    at::NoGradGuard no_grad;
    for (auto& p : params)
      if (p.grad().defined()) p.sub_(0.05 * p.grad());
  }
  EXPECT_FALSE(at::equal(m->graph().node("conv2").params.at("weight_step"), w_step0));

  // A step below 0 comes back to the floor.
  {
    at::NoGradGuard no_grad;
    m->graph().node(acts[0]).params.at("act_step").fill_(-1.0);
  }
  EXPECT_EQ(q::after_step(m->graph(), q::resolve(c)), 6);  // every step clamped (3 weights, 3 inputs)
  expect_close(m->graph().node(acts[0]).params.at("act_step"), {1e-8f}, 0);

  // The packed checkpoint: codes and steps, reloaded to bitwise the same outputs.
  m->eval();
  const at::Tensor input = at::randn({4, 1, 28, 28});
  const at::Tensor out = m->forward(input);
  const std::string dir = join_path(binary_dir(), "testdata/learned_quantizers");
  make_directories(dir);
  const std::string path = join_path(dir, "lsq.h5");
  save_checkpoint(path, m->graph());
  GraphModule reloaded(load_checkpoint(path).graph);
  reloaded->eval();
  EXPECT_EQ(reloaded->graph().node("conv2").attr_str("weight_encoding"), "uniform");
  EXPECT_TRUE(at::equal(reloaded->forward(input), out));
}

// PyTorch's values and gradients of the papers' formulations (tests/reference/
// make_learned_quantizer_reference.py): LSQ from the paper's pseudo-code (grad_scale and
// round_pass), PACT's clip 0.5·(|x| − |x − α| + α) with a straight-through rounding. Values to
// 1e-6 of the largest |value| (the formulations round the step or the clip differently in the last
// bit), input gradients to 1e-5 of their largest element (the same rounding of each element in
// another order; the parameters' bound is below).
TEST(LearnedQuantizers, EqualThePapersFormulationsInPyTorch) {
  torch::jit::Module ref =
      torch::jit::load(binary_dir() + "/testdata/learned_quantizer_reference/learned_quantizer_reference.pt");
  std::map<std::string, at::Tensor> t;
  for (const auto& b : ref.named_buffers()) t[b.name] = b.value;
  ASSERT_EQ(t.size(), 6u * 7u + 4u * 7u + 2u * 6u + 2u * 9u);
  auto near = [](const at::Tensor& got, const at::Tensor& want, double rel, const std::string& what) {
    const double scale = std::max(want.abs().max().item<double>(), 1e-12);
    EXPECT_LE((got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>(), rel * scale) << what;
  };
  // A step's or clip's gradient is a sum of terms of both signs that cancel (at 8 bits to 1e-3 of
  // their magnitude), so its bound is relative to the terms' size: g·Σ|upstream| per element of
  // the parameter, or its largest element when that is larger.
  auto check = [&](const std::string& c, const at::Tensor& y, const at::Tensor& x, const at::Tensor& p,
                   const std::string& key) {
    near(y, t.at(c + "_y"), 1e-6, c + " values");
    const at::Tensor& up = t.at(c + "_up");
    y.backward(up);
    near(x.grad(), t.at(c + "_gx"), 1e-5, c + " input gradient");
    const at::Tensor& want = t.at(c + "_g" + key);
    const double g = t.count(c + "_g") ? t.at(c + "_g").item<double>() : 1.0;
    const double terms = g * up.abs().sum().item<double>() / static_cast<double>(want.numel());
    const double bound = 1e-6 * std::max(terms, want.abs().max().item<double>());
    EXPECT_LE((p.grad().to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>(), bound) << c << " " << key;
  };
  for (int bits : {2, 4, 8}) {
    for (const std::string kind : {"tensor", "channel"}) {
      const std::string c = "lsq_w" + std::to_string(bits) + "_" + kind;
      const at::Tensor x = t.at(c + "_x").clone().set_requires_grad(true);
      const at::Tensor s = t.at(c + "_s").clone().set_requires_grad(true);
      // The gradient scale whittle's weight quantizer uses, against the reference's.
      const int64_t n = kind == "tensor" ? x.numel() : x.numel() / x.size(0);
      EXPECT_DOUBLE_EQ(q::lsq_gradient_scale(n, q::lsq_signed_grid(bits).q_p), t.at(c + "_g").item<double>()) << c;
      check(c, q::lsq_quantize(x, s, q::lsq_signed_grid(bits), t.at(c + "_g").item<double>(), 0), x, s, "s");
    }
  }
  // Activations through the act_quant nodes' own forward (gradient scale from the input's shape).
  Graph g = build_model("lenet5", ZooOptions{});
  q::Config lc;
  lc.method = "lsq";
  q::apply(g, lc);
  Graph pg = build_model("lenet5", ZooOptions{});
  q::Config pc;
  pc.method = "pact";
  q::apply(pg, pc);
  auto act_node = [](const Graph& graph) {
    for (const Node& n : graph.nodes())
      if (n.op == "act_quant") return n;
    throw Error("no act_quant node");
  };
  for (int bits : {1, 2, 4, 8}) {
    const std::string c = "lsq_a" + std::to_string(bits);
    Node n = act_node(g);
    n.attrs["activation_bits"] = int64_t{bits};
    n.attrs["relu"] = int64_t{0};
    const at::Tensor s = t.at(c + "_s").clone().set_requires_grad(true);
    n.params.set("act_step", s);
    const at::Tensor x = t.at(c + "_x").clone().set_requires_grad(true);
    check(c, q::activation_quantizer_of(n).forward(n, x, true), x, s, "s");
  }
  // LSQ+: the offset's gradient too.
  Graph lg = build_model("lenet5", ZooOptions{});
  q::Config lpc;
  lpc.method = "lsq_plus";
  q::apply(lg, lpc);
  for (int bits : {2, 4}) {
    const std::string c = "lsqp_a" + std::to_string(bits);
    Node n = act_node(lg);
    n.attrs["activation_bits"] = int64_t{bits};
    ASSERT_FALSE(n.attr_bool("relu"));  // conv2's input is pooled: a node with an offset
    const at::Tensor s = t.at(c + "_s").clone().set_requires_grad(true);
    const at::Tensor beta = t.at(c + "_beta").clone().set_requires_grad(true);
    n.params.set("act_step", s);
    n.params.set("act_offset", beta);
    const at::Tensor x = t.at(c + "_x").clone().set_requires_grad(true);
    check(c, q::activation_quantizer_of(n).forward(n, x, true), x, s, "s");
    const at::Tensor& want = t.at(c + "_gbeta");
    const double bound = 1e-6 * t.at(c + "_g").item<double>() * t.at(c + "_up").abs().sum().item<double>();
    EXPECT_LE((beta.grad().to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>(), bound) << c << " beta";
  }
  for (int bits : {2, 4}) {
    const std::string c = "pact_a" + std::to_string(bits);
    Node n = act_node(pg);
    n.attrs["activation_bits"] = int64_t{bits};
    n.attrs["relu"] = int64_t{0};
    const at::Tensor alpha = t.at(c + "_alpha").clone().set_requires_grad(true);
    n.params.set("act_clip", alpha);
    const at::Tensor x = t.at(c + "_x").clone().set_requires_grad(true);
    check(c, q::activation_quantizer_of(n).forward(n, x, true), x, alpha, "alpha");
  }
}

// Progressive bit widths: LeNet-5 at LSQ W4A4 lowered to W2A2 keeps each grid's range: weight
// steps × Q_P(4)/Q_P(2) = 7/1, activation steps × 15/3 = 5. A method without the form, and a
// selection mixing quantized and unquantized layers, are refused.
TEST(Lsq, ChangeBitsCarriesTheSteps) {
  GraphModule m(build_model("lenet5", ZooOptions{}));
  q::Config c;
  c.method = "lsq";
  q::apply(m, c);  // W4A4
  std::map<std::string, at::Tensor> before;
  for (const Node& n : m->graph().nodes())
    for (const char* p : {"weight_step", "act_step"})
      if (n.params.contains(p)) before[n.name + "." + p] = n.params.at(p).detach().clone();
  ASSERT_EQ(before.size(), 6u);
  EXPECT_EQ(q::quantized_by(m->graph(), c), (std::vector<std::string>{"conv2", "fc1", "fc2"}));
  c.weight_bits = 2;
  c.activation_bits = 2;
  const q::Report r = q::change_bits(m, c);
  EXPECT_EQ(r.quantized, (std::vector<std::string>{"conv2", "fc1", "fc2"}));
  for (const Node& n : m->graph().nodes()) {
    if (n.params.contains("weight_step")) {
      EXPECT_EQ(n.attr_int("weight_bits"), 2);
      EXPECT_TRUE(at::allclose(n.params.at("weight_step"), before.at(n.name + ".weight_step") * 7)) << n.name;
    }
    if (n.params.contains("act_step")) {
      EXPECT_EQ(n.attr_int("activation_bits"), 2);
      EXPECT_TRUE(at::allclose(n.params.at("act_step"), before.at(n.name + ".act_step") * 5)) << n.name;
    }
  }
  EXPECT_NO_THROW(m->forward(at::randn({2, 1, 28, 28})));

  // A selection with an unquantized layer (the first, named) beside quantized ones.
  c.targets = {"conv1", "conv2"};
  EXPECT_THROW(q::change_bits(m, c), Error);
  // DoReFa has no progressive form.
  Graph g = build_model("lenet5", ZooOptions{});
  q::Config d;
  d.method = "dorefa";
  q::apply(g, d);
  d.weight_bits = 2;
  try {
    q::change_bits(g, d);
    FAIL() << "dorefa changed bits";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dorefa"), std::string::npos) << e.what();
  }
}

// With a calibrator (step_init: mse), a stage starts the weight steps from it again, on the weights
// as they are: the step of each channel is the one a fresh W2 quantization of the same weights gets
// (not the range-keeping ×7); the activation steps are carried (the trainer calibrates them again
// over the stage's first batches) and input_quantizers names them.
TEST(Lsq, ChangeBitsWithACalibratorStartsTheWeightStepsAgain) {
  q::Config c;
  c.method = "lsq";
  c.options["step_init"] = std::string("mse");
  c.options["granularity"] = std::string("per_channel");
  GraphModule m(build_model("lenet5", ZooOptions{}));
  q::apply(m, c);  // W4A4
  {
    at::NoGradGuard ng;  // the weights move, as training would move them
    for (const char* layer : {"conv2", "fc1"}) m->graph().node(layer).params.at("weight").mul_(1.5);
  }
  std::map<std::string, at::Tensor> act_before;
  for (const Node& n : m->graph().nodes())
    if (n.params.contains("act_step")) act_before[n.name] = n.params.at("act_step").detach().clone();
  c.weight_bits = 2;
  c.activation_bits = 2;
  const q::Report r = q::change_bits(m, c);
  // The oracle: the same (moved) weights quantized at W2 from the start.
  Graph fresh = build_model("lenet5", ZooOptions{});
  for (Node& n : fresh.nodes())
    if (n.params.contains("weight")) n.params.set("weight", m->graph().node(n.name).params.at("weight").detach().clone());
  q::apply(fresh, c);
  for (const std::string layer : {"conv2", "fc1", "fc2"}) {
    const at::Tensor got = m->graph().node(layer).params.at("weight_step");
    ASSERT_EQ(got.numel(), m->graph().node(layer).params.at("weight").size(0)) << layer;  // per channel
    EXPECT_TRUE(got.equal(fresh.node(layer).params.at("weight_step"))) << layer;
  }
  for (const auto& [name, step] : act_before)
    EXPECT_TRUE(at::allclose(m->graph().node(name).params.at("act_step"), step * 5)) << name;
  std::vector<std::string> inputs = q::input_quantizers(m->graph(), r.quantized);
  std::vector<std::string> want;
  for (const auto& [name, step] : act_before) want.push_back(name);
  std::sort(inputs.begin(), inputs.end());
  EXPECT_EQ(inputs, want);
}

// The fused CPU kernels (quantize/fused_quantizers.h) against the ATen-op forms: the same values
// (== : the sign of a zero may differ), the same input gradients, and the step, offset and clip
// gradients within float32 rounding of their terms (the fused sums accumulate in double).
TEST(LearnedQuantizers, FusedKernelsEqualTheAtenForms) {
  at::manual_seed(11);
  const at::Tensor x = at::randn({8, 16, 9, 9}) * 1.5;
  const at::Tensor up = at::randn({8, 16, 9, 9});
  struct Result {
    at::Tensor y, gx, gp, gb;
  };
  auto run = [&](bool fused, const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>& f,
                 double p0, double b0) {
    q::set_fused_quantizers(fused);
    const at::Tensor xi = x.clone().set_requires_grad(true);
    const at::Tensor p = vec({static_cast<float>(p0)}).set_requires_grad(true);
    const at::Tensor b = vec({static_cast<float>(b0)}).set_requires_grad(true);
    const at::Tensor y = f(xi, p, b);
    y.backward(up);
    Result r{y.detach(), xi.grad(), p.grad(), b.grad()};
    q::set_fused_quantizers(true);
    return r;
  };
  const double terms = up.abs().sum().item<double>();
  auto same = [&](const Result& a, const Result& f, double g, const std::string& what) {
    EXPECT_TRUE(at::equal(a.y == f.y, at::ones_like(a.y, at::kBool))) << what << " values";
    EXPECT_TRUE(at::equal(a.gx, f.gx)) << what << " input gradient";
    EXPECT_NEAR(a.gp.item<double>(), f.gp.item<double>(), 1e-6 * g * terms) << what << " parameter gradient";
    if (a.gb.defined() || f.gb.defined())
      EXPECT_NEAR(a.gb.item<double>(), f.gb.item<double>(), 1e-6 * g * terms) << what << " offset gradient";
  };
  for (int bits : {2, 4, 8}) {
    const double g = q::lsq_gradient_scale(x.numel() / 8, (1 << bits) - 1);
    auto signed_lsq = [&](const at::Tensor& xi, const at::Tensor& p, const at::Tensor&) {
      return q::lsq_quantize(xi, p, q::lsq_signed_grid(bits), g);
    };
    auto shifted_lsq = [&](const at::Tensor& xi, const at::Tensor& p, const at::Tensor& b) {
      return q::lsq_quantize(xi, p, q::lsq_unsigned_grid(bits), g, 0, b);
    };
    same(run(false, signed_lsq, 0.3, 0), run(true, signed_lsq, 0.3, 0), g, "LSQ W" + std::to_string(bits));
    same(run(false, shifted_lsq, 0.2, -0.7), run(true, shifted_lsq, 0.2, -0.7), g, "LSQ+ A" + std::to_string(bits));
    // Every instruction-set variant of the backward microkernel gives the same sums, bit for bit.
    const std::vector<Isa> isas = supported_isas();
    std::vector<Result> per_isa;
    for (const Isa isa : isas) {
      set_isa(isa);
      per_isa.push_back(run(true, shifted_lsq, 0.2, -0.7));
    }
    set_isa(isas.back());
    for (size_t i = 1; i < per_isa.size(); ++i) {
      EXPECT_TRUE(at::equal(per_isa[i].gx, per_isa[0].gx)) << isa_name(isas[i]);
      EXPECT_EQ(per_isa[i].gp.item<float>(), per_isa[0].gp.item<float>()) << isa_name(isas[i]);
      EXPECT_EQ(per_isa[i].gb.item<float>(), per_isa[0].gb.item<float>()) << isa_name(isas[i]);
    }
  }
  Graph pg = build_model("lenet5", ZooOptions{});
  q::Config pc;
  pc.method = "pact";
  q::apply(pg, pc);
  for (int bits : {2, 4}) {
    for (bool relu : {false, true}) {
      Node n;
      for (const Node& m : pg.nodes())
        if (m.op == "act_quant") n = m;
      n.attrs["activation_bits"] = int64_t{bits};
      n.attrs["relu"] = int64_t{relu};
      auto pact = [&](const at::Tensor& xi, const at::Tensor& p, const at::Tensor&) {
        n.params.set("act_clip", p);
        return q::activation_quantizer_of(n).forward(n, xi, true);
      };
      same(run(false, pact, 1.3, 0), run(true, pact, 1.3, 0), 1.0, "PACT A" + std::to_string(bits));
    }
  }
}

// The paper's initial activation step 2·mean|x|/√Q_P is of what the layer reads: where the
// act_quant stands for a ReLU (relu = 1; LeNet-5's fc2 input), of the ReLU's output, not its input
// (a bug that started such steps 1.7 to 8 times too large on ResNet-20). Each node initializes
// before it quantizes, so the later nodes read quantized inputs: the same forward after the
// initialization gives the inputs each node read.
TEST(Lsq, PaperInitReadsWhatTheLayerReads) {
  at::manual_seed(6);
  GraphModule m{build_model("lenet5", ZooOptions{})};
  q::Config c;
  c.method = "lsq";
  q::apply(m, c);
  m->eval();
  const at::Tensor batch = at::randn({8, 1, 28, 28});
  EXPECT_EQ(q::initialize_learned(m, batch), 3);
  int64_t relus = 0;
  for (const Node& n : m->graph().nodes()) {
    if (n.op != "act_quant") continue;
    std::map<std::string, at::Tensor> captured;
    m->forward_with_intermediates({batch}, {n.inputs.at(0)}, &captured);
    const bool relu = n.attr_bool("relu");
    relus += relu;
    const at::Tensor read = relu ? at::relu(captured.at(n.inputs.at(0))) : captured.at(n.inputs.at(0));
    EXPECT_FLOAT_EQ(n.params.at("act_step").item<float>(), q::lsq_initial_step(read, q::lsq_unsigned_grid(4)).item<float>())
        << n.name;
  }
  EXPECT_EQ(relus, 1);
}

// What `whittle inspect` and the HTML report show of the learned values: conv2's weight steps set
// to 0.01·(1..16) give "lsq, weight_step 0.01 to 0.16"; an activation step of 0.25 on the 4-bit grid
// [0, 15] covers [0, 3.75]; LSQ+ with β = −0.5 and s = 0.1 covers [−0.5, 1]; PACT at α = 2.5, [0, 2.5].
TEST(Lsq, InspectShowsTheLearnedValues) {
  auto summary_of = [](const Graph& g) {
    std::map<std::string, std::string> out;
    for (const auto& l : runner::summarize_model(g).layers)
      if (!l.quantizer.empty()) out[l.name] = l.quantizer;
    return out;
  };
  Graph g = build_model("lenet5", ZooOptions{});
  q::Config c;
  c.method = "lsq";
  c.options["granularity"] = std::string("per_channel");
  q::apply(g, c);
  {
    at::NoGradGuard no_grad;
    g.node("conv2").params.at("weight_step").copy_(at::arange(1, 17, at::kFloat) * 0.01);
    for (Node& n : g.nodes())
      if (n.op == "act_quant") n.params.at("act_step").fill_(0.25);
  }
  std::map<std::string, std::string> s = summary_of(g);
  EXPECT_EQ(s.at("conv2"), "lsq, weight_step 0.01 to 0.16");
  int64_t acts = 0;
  for (const Node& n : g.nodes())
    if (n.op == "act_quant") {
      EXPECT_EQ(s.at(n.name), "lsq A4 on [0, 3.75]") << n.name;
      ++acts;
    }
  EXPECT_EQ(acts, 3);
  EXPECT_EQ(s.count("conv1"), 0u);  // the first layer stays in float

  Graph plus = build_model("lenet5", ZooOptions{});
  c.method = "lsq_plus";
  q::apply(plus, c);
  for (Node& n : plus.nodes())
    if (n.params.contains("act_offset")) {
      at::NoGradGuard no_grad;
      n.params.at("act_offset").fill_(-0.5);
      n.params.at("act_step").fill_(0.1);
      EXPECT_EQ(summary_of(plus).at(n.name), "lsq_plus A4 on [-0.5, 1]") << n.name;
    }

  Graph pact = build_model("lenet5", ZooOptions{});
  q::Config p;
  p.method = "pact";
  p.options["clip_init"] = 2.5;
  q::apply(pact, p);
  for (const Node& n : pact.nodes())
    if (n.op == "act_quant") EXPECT_EQ(summary_of(pact).at(n.name), "pact A4 on [0, 2.5]") << n.name;
}

TEST(Lsq, BitsOutsideTheMethodsRangeAreNamed) {
  Graph g = build_model("lenet5", ZooOptions{});
  q::Config c;
  c.method = "lsq";
  c.weight_bits = 1;
  try {
    q::apply(g, c);
    FAIL() << "1-bit LSQ weights were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_bits"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lsq"), std::string::npos) << e.what();
  }
  c.weight_bits = 4;
  c.activation_bits = 9;
  EXPECT_THROW(q::apply(g, c), Error);
}

}  // namespace
}  // namespace whittle::test
