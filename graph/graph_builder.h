#pragma once
// GraphBuilder: appends layers to a Graph one call at a time, creating parameters with torch.nn's
// default initialization. Used by the model zoo (zoo.cpp); not part of the installed API.

#include <ATen/core/Generator.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/weight_init.h"

namespace whittle {

/// Builds a Graph layer by layer. Each method appends one node named `name` (which is also its
/// state_dict prefix), infers the input channels / features from the shape of the input value,
/// and returns the name of the node's output value. Parameters are float32 CPU tensors with
/// requires_grad(true), initialized as torch.nn does (conv weights optionally as He et al., 2015:
/// the constructor's `conv_init`): weights Kaiming-uniform with a = √5
/// (U(−1/√fan_in, 1/√fan_in)), biases U(−1/√fan_in, 1/√fan_in); BN weight 1, bias 0, running_mean 0,
/// running_var 1, num_batches_tracked an int64 scalar 0. Shape errors throw whittle::Error naming
/// the node (from Graph::add_node).
class GraphBuilder {
 public:
  /// `seed`: when given, parameters are drawn from a private CPU generator seeded with it (the
  /// result does not depend on, and does not advance, LibTorch's global generator); otherwise from
  /// LibTorch's default CPU generator, as torch.nn layers do.
  /// `conv_init`: how conv2d draws its weights (zoo.h, WeightInit); biases and the other layers
  /// are as torch.nn does whatever it is.
  explicit GraphBuilder(std::optional<uint64_t> seed = std::nullopt, WeightInit conv_init = WeightInit::kTorch);

  /// Declares the graph input `name` with its example shape (batch dimension included).
  std::string input(const std::string& name, Shape shape);

  /// torch.nn.Conv2d: square `kernel`, `stride`, zero `padding`, `groups`; in_channels from x's
  /// dim 1 (which `groups` must divide). Weight [out_channels, in/groups, kernel, kernel].
  std::string conv2d(const std::string& name, const std::string& x, int64_t out_channels, int64_t kernel,
                     int64_t stride = 1, int64_t padding = 0, int64_t groups = 1, bool bias = true);
  /// torch.nn.BatchNorm2d/1d with eps 1e-5, momentum 0.1, affine, tracking running statistics;
  /// channels from x's dim 1.
  std::string batch_norm(const std::string& name, const std::string& x);
  /// torch.nn.Linear: in_features from x's last dimension. Weight [out_features, in_features].
  std::string linear(const std::string& name, const std::string& x, int64_t out_features, bool bias = true);
  /// max(x, 0).
  std::string relu(const std::string& name, const std::string& x);
  /// min(max(x, 0), 6).
  std::string relu6(const std::string& name, const std::string& x);
  /// torch.nn.MaxPool2d with a square window; `stride` 0 means stride = kernel.
  std::string max_pool2d(const std::string& name, const std::string& x, int64_t kernel, int64_t stride = 0,
                         int64_t padding = 0);
  /// Global average pool: adaptive_avg_pool2d to 1×1, output [N, C, 1, 1].
  std::string global_avg_pool(const std::string& name, const std::string& x);
  /// torch.flatten(x, 1).
  std::string flatten(const std::string& name, const std::string& x);
  /// Elementwise a + b.
  std::string add(const std::string& name, const std::string& a, const std::string& b);
  /// ShuffleNet's channel shuffle (Zhang et al., 2018): x [N, C, ...] viewed as [N, groups,
  /// C/groups, ...], dims 1 and 2 swapped, viewed back; `groups` must divide C.
  std::string channel_shuffle(const std::string& name, const std::string& x, int64_t groups);

  /// Shape of a value built so far; throws whittle::Error when unknown.
  const Shape& shape(const std::string& value) const { return graph_.value(value).shape; }
  /// Marks `outputs` as the graph outputs, validates, and hands the graph over.
  Graph finish(std::vector<std::string> outputs);

 private:
  std::string op(const std::string& name, const std::string& kind, std::vector<std::string> inputs,
                 std::map<std::string, Attr> attrs = {});
  /// A float32 tensor of `sizes` drawn from U(−bound, bound), requires_grad(true).
  at::Tensor uniform(std::vector<int64_t> sizes, double bound);
  /// A float32 tensor of `sizes` drawn from N(0, stddev²), requires_grad(true).
  at::Tensor normal(std::vector<int64_t> sizes, double stddev);

  Graph graph_;
  std::optional<at::Generator> generator_;
  WeightInit conv_init_;
};

}  // namespace whittle
