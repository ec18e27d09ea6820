#pragma once
// Small graphs shared by the test suites.

#include <ATen/ATen.h>

#include "graph/graph.h"

namespace whittle::test {

/// A node with the given name, op, inputs and attributes (no tensors yet).
inline Node make(std::string name, std::string op, std::vector<std::string> inputs,
                 std::map<std::string, Attr> attrs = {}) {
  Node n;
  n.name = std::move(name);
  n.op = std::move(op);
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  return n;
}

/// conv(3→8, k3, p1, bias) → batch_norm → relu → max_pool2d(2) → flatten → linear(128 → 10), input
/// [2, 3, 8, 8]; random weights and non-trivial running statistics from LibTorch's global generator.
inline Graph small_net() {
  Graph g;
  g.add_input("x", {2, 3, 8, 8});
  Node conv = make("features.0", "conv2d", {"x"}, {{"padding", std::vector<int64_t>{1, 1}}});
  conv.params.set("weight", at::randn({8, 3, 3, 3}).set_requires_grad(true));
  conv.params.set("bias", at::randn({8}).set_requires_grad(true));
  g.add_node(conv);
  Node bn = make("features.1", "batch_norm", {"features.0"});
  bn.params.set("weight", at::rand({8}).add_(0.5).set_requires_grad(true));
  bn.params.set("bias", at::randn({8}).set_requires_grad(true));
  bn.buffers.set("running_mean", at::randn({8}));
  bn.buffers.set("running_var", at::rand({8}).add_(0.5));
  bn.buffers.set("num_batches_tracked", at::zeros({}, at::kLong));
  g.add_node(bn);
  g.add_node(make("features.2", "relu", {"features.1"}));
  g.add_node(make("features.3", "max_pool2d", {"features.2"}, {{"kernel_size", int64_t{2}}}));
  g.add_node(make("flatten", "flatten", {"features.3"}));
  Node fc = make("classifier", "linear", {"flatten"});
  fc.params.set("weight", at::randn({10, 128}).mul_(0.1).set_requires_grad(true));
  fc.params.set("bias", at::randn({10}).set_requires_grad(true));
  g.add_node(fc);
  g.set_outputs({"classifier"});
  return g;
}

}  // namespace whittle::test
