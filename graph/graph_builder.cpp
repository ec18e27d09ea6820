#include "graph/graph_builder.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <utility>

#include "core/error.h"

namespace whittle {

GraphBuilder::GraphBuilder(std::optional<uint64_t> seed, WeightInit conv_init) : conv_init_(conv_init) {
  if (seed) generator_ = at::detail::createCPUGenerator(*seed);
}

std::string GraphBuilder::input(const std::string& name, Shape shape) { return graph_.add_input(name, std::move(shape)).name; }

at::Tensor GraphBuilder::uniform(std::vector<int64_t> sizes, double bound) {
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
  t.uniform_(-bound, bound, generator_);
  return t.set_requires_grad(true);
}

at::Tensor GraphBuilder::normal(std::vector<int64_t> sizes, double stddev) {
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
  t.normal_(0.0, stddev, generator_);
  return t.set_requires_grad(true);
}

std::string GraphBuilder::op(const std::string& name, const std::string& kind, std::vector<std::string> inputs,
                             std::map<std::string, Attr> attrs) {
  Node n;
  n.name = name;
  n.op = kind;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  return graph_.add_node(std::move(n));
}

std::string GraphBuilder::conv2d(const std::string& name, const std::string& x, int64_t out_channels, int64_t kernel,
                                 int64_t stride, int64_t padding, int64_t groups, bool bias) {
  const Shape& in = shape(x);
  if (in.size() != 4) throw Error("conv2d '" + name + "': input '" + x + "' must be NCHW, got " + shape_str(in));
  if (groups < 1 || in[1] % groups != 0 || out_channels % groups != 0)
    throw Error("conv2d '" + name + "': groups=" + std::to_string(groups) + " must divide in_channels " +
                std::to_string(in[1]) + " and out_channels " + std::to_string(out_channels));
  const int64_t fan_in = in[1] / groups * kernel * kernel;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  Node n;
  n.name = name;
  n.op = "conv2d";
  n.inputs = {x};
  n.attrs = {{"stride", std::vector<int64_t>{stride, stride}},
             {"padding", std::vector<int64_t>{padding, padding}},
             {"groups", groups}};
  const std::vector<int64_t> sizes = {out_channels, in[1] / groups, kernel, kernel};
  n.params.set("weight", conv_init_ == WeightInit::kKaimingNormal
                             ? normal(sizes, std::sqrt(2.0 / static_cast<double>(fan_in)))
                             : uniform(sizes, bound));
  if (bias) n.params.set("bias", uniform({out_channels}, bound));
  return graph_.add_node(std::move(n));
}

std::string GraphBuilder::batch_norm(const std::string& name, const std::string& x) {
  const Shape& in = shape(x);
  if (in.size() < 2) throw Error("batch_norm '" + name + "': input '" + x + "' must be [N, C, ...], got " + shape_str(in));
  const int64_t c = in[1];
  Node n;
  n.name = name;
  n.op = "batch_norm";
  n.inputs = {x};
  n.params.set("weight", at::ones({c}).set_requires_grad(true));
  n.params.set("bias", at::zeros({c}).set_requires_grad(true));
  n.buffers.set("running_mean", at::zeros({c}));
  n.buffers.set("running_var", at::ones({c}));
  n.buffers.set("num_batches_tracked", at::zeros({}, at::kLong));
  return graph_.add_node(std::move(n));
}

std::string GraphBuilder::linear(const std::string& name, const std::string& x, int64_t out_features, bool bias) {
  const Shape& in = shape(x);
  if (in.size() < 2) throw Error("linear '" + name + "': input '" + x + "' must be [N, ..., features], got " + shape_str(in));
  const int64_t fan_in = in.back();
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  Node n;
  n.name = name;
  n.op = "linear";
  n.inputs = {x};
  n.params.set("weight", uniform({out_features, fan_in}, bound));
  if (bias) n.params.set("bias", uniform({out_features}, bound));
  return graph_.add_node(std::move(n));
}

std::string GraphBuilder::relu(const std::string& name, const std::string& x) { return op(name, "relu", {x}); }

std::string GraphBuilder::relu6(const std::string& name, const std::string& x) { return op(name, "relu6", {x}); }

std::string GraphBuilder::max_pool2d(const std::string& name, const std::string& x, int64_t kernel, int64_t stride,
                                     int64_t padding) {
  if (stride == 0) stride = kernel;
  return op(name, "max_pool2d", {x},
            {{"kernel_size", std::vector<int64_t>{kernel, kernel}},
             {"stride", std::vector<int64_t>{stride, stride}},
             {"padding", std::vector<int64_t>{padding, padding}}});
}

std::string GraphBuilder::global_avg_pool(const std::string& name, const std::string& x) {
  return op(name, "adaptive_avg_pool2d", {x}, {{"output_size", std::vector<int64_t>{1, 1}}});
}

std::string GraphBuilder::flatten(const std::string& name, const std::string& x) {
  return op(name, "flatten", {x}, {{"start_dim", int64_t{1}}});
}

std::string GraphBuilder::channel_shuffle(const std::string& name, const std::string& x, int64_t groups) {
  return op(name, "channel_shuffle", {x}, {{"groups", groups}});
}

std::string GraphBuilder::add(const std::string& name, const std::string& a, const std::string& b) {
  return op(name, "add", {a, b});
}

Graph GraphBuilder::finish(std::vector<std::string> outputs) {
  graph_.set_outputs(std::move(outputs));
  graph_.validate();
  return std::move(graph_);
}

}  // namespace whittle
