// Activation checkpointing (GraphModule::set_checkpoint_segments): a training step with segments
// recomputed in the backward gives the outputs, gradients and batch-norm running statistics of the
// plain step, on a DoReFa W4A4 ResNet-20 and on a graph with dropout inside a segment; bad
// segment lists are refused with the segment named.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <torch/csrc/autograd/function.h>
#include <vector>

#include "core/error.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "quantize/quantize.h"
#include "support.h"

namespace whittle::test {
namespace {

struct StepResult {
  at::Tensor output;
  std::map<std::string, at::Tensor> grads, buffers;
  int checkpointed_nodes = 0;  ///< CheckpointFn nodes in the output's autograd graph
};

// The autograd nodes named like `name` reachable from t's grad_fn.
int count_grad_nodes(const at::Tensor& t, const std::string& name) {
  std::vector<torch::autograd::Node*> pending{t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int count = 0;
  while (!pending.empty()) {
    torch::autograd::Node* n = pending.back();
    pending.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (n->name().find(name) != std::string::npos) ++count;
    for (const auto& e : n->next_edges()) pending.push_back(e.function.get());
  }
  return count;
}

// One forward and backward in training mode of a fresh copy of `graph` (the same initial values),
// with the given segments checkpointed.
StepResult train_step(const Graph& graph, const std::vector<std::string>& segments, const at::Tensor& x, uint64_t seed) {
  GraphModule m(graph.clone());
  m->set_checkpoint_segments(segments);
  m->train();
  at::manual_seed(seed);
  StepResult r;
  r.output = m->forward(x);
  r.checkpointed_nodes = count_grad_nodes(r.output, "CheckpointFn");
  (r.output * at::linspace(-1, 1, r.output.numel()).view(r.output.sizes())).sum().backward();
  for (const auto& kv : m->named_parameters()) r.grads[kv.key()] = kv.value().grad().clone();
  for (const auto& kv : m->named_buffers()) r.buffers[kv.key()] = kv.value().clone();
  return r;
}

void expect_same_step(const StepResult& plain, const StepResult& checkpointed, double rtol) {
  EXPECT_TRUE(at::allclose(plain.output, checkpointed.output, rtol, 0)) << "output";
  ASSERT_EQ(plain.grads.size(), checkpointed.grads.size());
  for (const auto& [name, g] : plain.grads) {
    const at::Tensor& c = checkpointed.grads.at(name);
    EXPECT_TRUE(at::allclose(g, c, rtol, 1e-7)) << name << ": max difference " << (g - c).abs().max().item<double>();
  }
  for (const auto& [name, b] : plain.buffers) EXPECT_TRUE(b.equal(checkpointed.buffers.at(name))) << name;
}

// ResNet-20 with DoReFa W4A4 (batch norms, straight-through quantizers, residual adds and 1×1
// shortcuts inside and across segments): the forward is the same computation, so the output is
// bit for bit the plain one; the gradients agree to float rounding (the backward of a segment
// sums the contributions to its input in its own order); the running statistics are updated once.
// The 1e-5 relative tolerance holds with OMP_NUM_THREADS=1 and ATEN_CPU_CAPABILITY=default too
// (both checked): the two runs differ only in summation order, a few ulps.
TEST(ActivationCheckpointing, ResNet20W4A4MatchesThePlainStep) {
  Graph g = build_model("resnet20");
  quantize::Config c;
  c.method = "dorefa";
  c.weight_bits = 4;
  c.activation_bits = 4;
  quantize::apply(g, c);
  at::manual_seed(0);
  const at::Tensor x = at::randn({4, 3, 32, 32});
  const StepResult plain = train_step(g, {}, x, 1);
  EXPECT_EQ(plain.checkpointed_nodes, 0);
  for (const std::vector<std::string>& segments :
       {std::vector<std::string>{"layer1", "layer2", "layer3"}, std::vector<std::string>{"layer2.1", "layer3.0"},
        std::vector<std::string>{"conv1", "layer1.0"}}) {
    const StepResult checkpointed = train_step(g, segments, x, 1);
    EXPECT_EQ(checkpointed.checkpointed_nodes, static_cast<int>(segments.size())) << segments[0];
    EXPECT_TRUE(plain.output.equal(checkpointed.output)) << segments[0];
    expect_same_step(plain, checkpointed, 1e-5);
  }
  // The running statistics moved (one update, not zero or two).
  GraphModule fresh(g.clone());
  const at::Tensor before = fresh->named_buffers()["layer2.1.bn1.running_mean"];
  EXPECT_FALSE(before.equal(plain.buffers.at("layer2.1.bn1.running_mean")));
  EXPECT_EQ(plain.buffers.at("layer2.1.bn1.num_batches_tracked").item<int64_t>(), 1);
}

// Dropout inside a segment draws the same mask when recomputed; the random state after the step is
// the plain step's (the recomputation does not advance it).
TEST(ActivationCheckpointing, DropoutDrawsTheSameMask) {
  Graph g;
  g.add_input("x", {8, 16});
  Node fc1{"block.fc1", "linear", {"x"}, {}, {}, {}, {}};
  fc1.params.set("weight", (at::randn({32, 16}) * 0.3).set_requires_grad(true));
  g.add_node(fc1);
  g.add_node(Node{"block.relu", "relu", {"block.fc1"}, {}, {}, {}, {}});
  Node drop{"block.drop", "dropout", {"block.relu"}, {}, {}, {}, {}};
  drop.attrs["p"] = 0.5;
  g.add_node(drop);
  Node fc2{"head", "linear", {"block.drop"}, {}, {}, {}, {}};
  fc2.params.set("weight", (at::randn({4, 32}) * 0.3).set_requires_grad(true));
  g.add_node(fc2);
  g.set_outputs({"head"});
  const at::Tensor x = at::randn({8, 16});
  const StepResult plain = train_step(g, {}, x, 7);
  const at::Tensor after_plain = at::rand({4});
  const StepResult checkpointed = train_step(g, {"block"}, x, 7);
  EXPECT_EQ(checkpointed.checkpointed_nodes, 1);
  const at::Tensor after_checkpointed = at::rand({4});
  EXPECT_TRUE(plain.output.equal(checkpointed.output));
  expect_same_step(plain, checkpointed, 1e-6);
  EXPECT_TRUE(after_plain.equal(after_checkpointed));
}

// Evaluation and no-grad forwards run plainly; the result is the same either way.
TEST(ActivationCheckpointing, EvalAndNoGradRunPlainly) {
  GraphModule m(build_model("resnet20"));
  m->set_checkpoint_segments({"layer1", "layer2", "layer3"});
  EXPECT_EQ(m->checkpoint_segments().size(), 3u);
  m->eval();
  const at::Tensor x = at::randn({2, 3, 32, 32});
  const at::Tensor a = m->forward(x);
  m->set_checkpoint_segments({});
  EXPECT_TRUE(a.equal(m->forward(x)));
  m->train();
  m->set_checkpoint_segments({"layer1"});
  at::NoGradGuard no_grad;
  EXPECT_FALSE(m->forward(x).requires_grad());
}

// `f` throws whittle::Error whose message contains `part`.
template <class F>
::testing::AssertionResult throws_naming(F f, const std::string& part) {
  try {
    f();
  } catch (const Error& e) {
    if (std::string(e.what()).find(part) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message '" << e.what() << "' lacks '" << part << "'";
  }
  return ::testing::AssertionFailure() << "nothing thrown";
}

TEST(ActivationCheckpointing, BadSegmentsAreNamed) {
  GraphModule m(build_model("resnet20"));
  m->set_checkpoint_segments({"layer1"});
  EXPECT_TRUE(throws_naming([&] { m->set_checkpoint_segments({"layer9"}); }, "segment 'layer9' names no node"));
  EXPECT_TRUE(throws_naming([&] { m->set_checkpoint_segments({"layer1", "layer1.0"}); }, "overlap"));
  // "layer" matches no node name exactly or as a dotted prefix (layer1.… starts with "layer1.").
  EXPECT_TRUE(throws_naming([&] { m->set_checkpoint_segments({"layer"}); }, "names no node"));
  // A refused list leaves the previous one.
  EXPECT_EQ(m->checkpoint_segments(), std::vector<std::string>{"layer1"});
}

}  // namespace
}  // namespace whittle::test
