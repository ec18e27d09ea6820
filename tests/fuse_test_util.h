#pragma once
// Helpers shared by the fusion test suites (fuse_test.cpp, fuse_import_test.cpp).

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <string>

#include "graph/graph.h"
#include "graph/graph_module.h"
#include "support.h"

namespace whittle::test {

/// Non-trivial statistics and affine parameters for every BN node, so that folding has work to do.
inline void randomize_batchnorm(Graph& g) {
  at::NoGradGuard no_grad;
  for (Node& n : g.nodes()) {
    if (n.op != "batch_norm") continue;
    const int64_t c = n.buffers.at("running_mean").size(0);
    n.buffers.at("running_mean").copy_(at::randn({c}) * 0.2);
    n.buffers.at("running_var").copy_(at::rand({c}) * 1.5 + 0.5);
    if (at::Tensor* w = n.params.find("weight")) w->copy_(at::rand({c}) + 0.5);
    if (at::Tensor* b = n.params.find("bias")) b->copy_(at::randn({c}) * 0.2);
  }
}

/// Number of nodes of op kind `op`.
inline int64_t count_op(const Graph& g, const std::string& op) {
  int64_t k = 0;
  for (const auto& n : g.nodes()) k += n.op == op;
  return k;
}

/// The module's output in eval mode, without gradient.
inline at::Tensor run_eval(GraphModule& m, const at::Tensor& x) {
  m->eval();
  at::NoGradGuard no_grad;
  return m->forward(x);
}

// Fused against unfused: max |difference| ≤ 1e−5 · max |output|. float32 rounding of the
// reassociated products (W·s instead of (W·x)·s) is ~1e−7 relative per layer; 1e−5 leaves room
// for the depth of these networks (up to 22 layers) without hiding a wrong channel or scale.
inline ::testing::AssertionResult same_function(const at::Tensor& fused, const at::Tensor& original) {
  const double scale = original.abs().max().item<double>();
  if (!(scale > 0)) return ::testing::AssertionFailure() << "the original output is all zeros";
  return all_close(fused, original, 1e-5 * scale, 0.0);
}

}  // namespace whittle::test
