// The op registry's channel knowledge (axes, slicing), its TorchScript mapping, and weight
// transform stacks (mask, then a quantizer) through forward, gradient and checkpoints.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "export/checkpoint.h"
#include "fuse/fuse.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "graph/serialize.h"
#include "graph/zoo.h"
#include "quantize/quantize.h"
#include "quantize/quantizers.h"
#include "support.h"

namespace whittle::test {
namespace {

namespace q = whittle::quantize;
using Names = std::vector<std::string>;

Node conv_node(int64_t cout, int64_t cin, int64_t groups) {
  Node n;
  n.name = "c";
  n.op = "conv2d";
  n.attrs["groups"] = groups;
  n.attrs["padding"] = std::vector<int64_t>{1, 1};
  n.params.set("weight", at::randn({cout, cin / groups, 3, 3}));
  n.params.set("bias", at::randn({cout}));
  return n;
}

at::Tensor run_conv(const Node& n, const at::Tensor& x) {
  return op_traits("conv2d").forward(n, {x}, false)[0];
}

at::Tensor idx(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }

TEST(OpRegistry, ChannelAxesComeFromTheEntries) {
  Node c;
  c.op = "conv2d";
  Node t;
  t.op = "conv_transpose2d";
  Node l;
  l.op = "linear";
  Node b;
  b.op = "batch_norm";
  Node r;
  r.op = "relu";
  EXPECT_EQ(weight_output_axis(c), 0);
  EXPECT_EQ(weight_output_axis(t), 1);  // [Cin, Cout/groups, kh, kw]
  EXPECT_EQ(weight_output_axis(l), 0);
  EXPECT_FALSE(weight_output_axis(b).has_value());
  EXPECT_TRUE(is_weighted_layer(c) && is_weighted_layer(t) && is_weighted_layer(l));
  EXPECT_FALSE(is_weighted_layer(b) || is_weighted_layer(r));
  EXPECT_TRUE(folds_batchnorm(c) && folds_batchnorm(t) && folds_batchnorm(l));
  EXPECT_FALSE(folds_batchnorm(b));
  EXPECT_TRUE(op_traits("max_pool2d").commutes_with_sign);
  EXPECT_FALSE(op_traits("avg_pool2d").commutes_with_sign);
  // The transposed conv's output axis holds one group's channels.
  for (const ChannelTensor& ct : channel_tensors(t))
    if (ct.name == "weight") EXPECT_EQ(ct.per_group, ct.role == ChannelRole::kOutput);
}

TEST(OpRegistry, TorchScriptOperatorsMapOntoOps) {
  EXPECT_EQ(op_for_torchscript("aten::conv2d"), "conv2d");
  EXPECT_EQ(op_for_torchscript("aten::_convolution"), "conv2d");
  EXPECT_EQ(op_for_torchscript("aten::relu_"), "relu");  // in-place variant
  EXPECT_EQ(op_for_torchscript("aten::addmm"), "linear");
  EXPECT_EQ(op_for_torchscript("aten::concatenate"), "cat");
  EXPECT_EQ(op_for_torchscript("aten::fft_fft2"), "");
  EXPECT_EQ(op_for_torchscript("aten::__and__"), "");
}

TEST(OpRegistry, SlicingAConvKeepsTheChosenFiltersAndInputs) {
  at::manual_seed(0);
  Node n = conv_node(6, 4, 1);
  const at::Tensor x = at::randn({2, 4, 5, 5});
  const at::Tensor full = run_conv(n, x);
  Node out = n;
  slice_channels(out, ChannelRole::kOutput, {1, 4, 5});
  EXPECT_EQ(out.params.at("weight").sizes(), (at::IntArrayRef{3, 4, 3, 3}));
  // A convolution with 3 filters may run another kernel than one with 6 (oneDNN picks by shape,
  // CPU instruction set and thread count), so the outputs agree to rounding, not bitwise.
  EXPECT_TRUE(at::allclose(run_conv(out, x), full.index_select(1, idx({1, 4, 5})), 1e-5, 1e-5));
  // Input side: the kept input channels give the same output as zeroing the others.
  Node in = n;
  slice_channels(in, ChannelRole::kInput, {0, 2});
  EXPECT_EQ(in.params.at("weight").sizes(), (at::IntArrayRef{6, 2, 3, 3}));
  at::Tensor zeroed = x.clone();
  zeroed.index_fill_(1, idx({1, 3}), 0.0);
  EXPECT_TRUE(at::allclose(run_conv(in, x.index_select(1, idx({0, 2}))), run_conv(n, zeroed), 1e-5, 1e-5));
  // Bad subsets are named.
  Node bad = n;
  EXPECT_THROW(slice_channels(bad, ChannelRole::kOutput, {2, 1}), Error);
  EXPECT_THROW(slice_channels(bad, ChannelRole::kOutput, {6}), Error);
  EXPECT_THROW(slice_channels(bad, ChannelRole::kOutput, {}), Error);
}

TEST(OpRegistry, SlicingDepthwiseAndGroupedConvs) {
  at::manual_seed(1);
  // Depthwise: input and output channels are tied; groups becomes the number kept.
  Node dw = conv_node(8, 8, 8);
  const at::Tensor x = at::randn({1, 8, 6, 6});
  const at::Tensor full = run_conv(dw, x);
  slice_channels(dw, ChannelRole::kOutput, {0, 3, 7});
  EXPECT_EQ(dw.attr_int("groups"), 3);
  EXPECT_EQ(dw.params.at("weight").sizes(), (at::IntArrayRef{3, 1, 3, 3}));
  EXPECT_TRUE(at::allclose(run_conv(dw, x.index_select(1, idx({0, 3, 7}))), full.index_select(1, idx({0, 3, 7})), 1e-5, 1e-5));
  // Grouped (2 groups of 2 inputs, 3 outputs each): the same input offset in every group.
  Node g = conv_node(6, 4, 2);
  Node gi = g;
  slice_channels(gi, ChannelRole::kInput, {1, 3});
  EXPECT_EQ(gi.params.at("weight").sizes(), (at::IntArrayRef{6, 1, 3, 3}));
  EXPECT_EQ(gi.attr_int("groups"), 2);
  // Different offsets per group (0 in the first, 1 in the second): each group selects its own.
  Node offsets = g;
  slice_channels(offsets, ChannelRole::kInput, {0, 3});
  EXPECT_EQ(offsets.params.at("weight").sizes(), (at::IntArrayRef{6, 1, 3, 3}));
  const at::Tensor x4 = at::randn({1, 4, 6, 6});
  at::Tensor masked = x4.clone();
  masked.select(1, 1).zero_();
  masked.select(1, 2).zero_();
  EXPECT_TRUE(at::allclose(run_conv(offsets, x4.index_select(1, idx({0, 3}))), run_conv(g, masked), 1e-5, 1e-5));
  Node uneven = g;
  EXPECT_THROW(slice_channels(uneven, ChannelRole::kInput, {0, 1, 3}), Error);   // 2 + 1 per group
  EXPECT_THROW(slice_channels(uneven, ChannelRole::kOutput, {0, 1, 3}), Error);  // 2 + 1 per group
  Node go = g;
  slice_channels(go, ChannelRole::kOutput, {0, 2, 3, 5});
  EXPECT_EQ(go.params.at("weight").sizes(), (at::IntArrayRef{4, 2, 3, 3}));
}

TEST(OpRegistry, SlicingBatchNormAndTransposedConv) {
  Node bn;
  bn.name = "bn";
  bn.op = "batch_norm";
  bn.params.set("weight", at::arange(4, at::kFloat));
  bn.params.set("bias", at::arange(4, at::kFloat) + 10);
  bn.buffers.set("running_mean", at::arange(4, at::kFloat) + 20);
  bn.buffers.set("running_var", at::arange(4, at::kFloat) + 30);
  slice_channels(bn, ChannelRole::kChannel, {1, 3});
  EXPECT_TRUE(bn.params.at("weight").equal(at::tensor({1.f, 3.f})));
  EXPECT_TRUE(bn.buffers.at("running_var").equal(at::tensor({31.f, 33.f})));
  Node t;
  t.name = "t";
  t.op = "conv_transpose2d";
  t.params.set("weight", at::randn({3, 5, 2, 2}));
  t.params.set("bias", at::randn({5}));
  const at::Tensor w = t.params.at("weight").clone();
  slice_channels(t, ChannelRole::kOutput, {0, 4});
  EXPECT_TRUE(t.params.at("weight").equal(w.index_select(1, idx({0, 4}))));
  EXPECT_EQ(t.params.at("bias").size(0), 2);
  slice_channels(t, ChannelRole::kInput, {2});
  EXPECT_EQ(t.params.at("weight").sizes(), (at::IntArrayRef{1, 2, 2, 2}));
}

// LeNet-5 with conv2 under a fixed mask, then DoReFa W4A32.
GraphModule masked_then_quantized(at::Tensor* mask) {
  GraphModule m(build_model("lenet5"));
  Node& conv2 = m->graph().node("conv2");
  const at::Tensor w = conv2.params.at("weight");
  *mask = (at::rand(w.sizes(), at::TensorOptions().dtype(at::kFloat)) > 0.5).to(at::kFloat);
  conv2.buffers.set("weight_mask", *mask);
  push_weight_transform(conv2, "mask");
  q::Config c;
  c.method = "dorefa";
  c.weight_bits = 4;
  c.activation_bits = 32;
  q::Report r = q::apply(m, c);
  EXPECT_EQ(m->graph().node("conv2").weight_transforms, (Names{"mask", "dorefa"})) << r.summary();
  return m;
}

TEST(TransformStack, MaskThenDoReFaForwardGradientAndCheckpoint) {
  at::manual_seed(2);
  at::Tensor mask;
  GraphModule m = masked_then_quantized(&mask);
  m->eval();
  const Node& conv2 = m->graph().node("conv2");
  const at::Tensor latent = conv2.params.at("weight");
  // The stack's value: DoReFa of the masked latent weight (hand-composed from the quantizer).
  const at::Tensor expected = q::dorefa_weight(latent * mask, 4, q::Granularity::kPerTensor, 0);
  EXPECT_TRUE(transformed_weight(conv2, false).equal(expected));
  EXPECT_TRUE(transformed_weight(conv2, false, 1).equal(latent * mask));  // the first stage alone
  // The module's forward runs conv2 with that weight.
  const at::Tensor x = at::randn({3, 1, 28, 28});
  std::map<std::string, at::Tensor> cap;
  m->forward_with_intermediates({x}, {"conv2", conv2.inputs[0]}, &cap);
  Node by_hand = conv2;
  by_hand.weight_transforms.clear();
  by_hand.params.set("weight", expected);
  EXPECT_TRUE(op_traits("conv2d").forward(by_hand, {cap[conv2.inputs[0]]}, false)[0].equal(cap["conv2"]));
  // Masked entries of the latent weight get no gradient (the mask's chain rule through the STE).
  m->train();
  m->forward(x).sum().backward();
  const at::Tensor grad = m->named_parameters()["conv2.weight"].grad();
  EXPECT_EQ(grad.masked_select(mask == 0).abs().max().item<float>(), 0.0f);
  EXPECT_GT(grad.masked_select(mask == 1).abs().max().item<float>(), 0.0f);

  // Training state form (graph JSON + tensors): the stack keeps its order.
  Graph g = graph_from_json(graph_to_json(m->graph()), [&](const std::string& node, TensorRole role, const std::string& name,
                                                            const Shape&, at::ScalarType) {
    const Node& n = m->graph().node(node);
    return role == TensorRole::kParam ? n.params.at(name) : n.buffers.at(name);
  });
  EXPECT_EQ(g.node("conv2").weight_transforms, (Names{"mask", "dorefa"}));

  // Packed checkpoint: the mask is baked into the codes, its buffer dropped, outputs bitwise equal.
  m->eval();
  const at::Tensor before = m->forward(x);
  const std::string dir = join_path(binary_dir(), "testdata/registry");
  make_directories(dir);
  const std::string path = join_path(dir, "lenet5_mask_dorefa.h5");
  save_checkpoint(path, m->graph());
  Checkpoint ck = load_checkpoint(path);
  const Node& packed = ck.graph.node("conv2");
  EXPECT_EQ(packed.weight_transforms, Names{"packed"});
  EXPECT_FALSE(packed.buffers.contains("weight_mask"));
  EXPECT_TRUE(q::decode_packed_weight(packed).equal(expected));
  GraphModule reloaded(ck.graph);
  reloaded->eval();
  EXPECT_TRUE(reloaded->forward(x).equal(before));
}

TEST(TransformStack, VersionOneGraphsReadAsStacks) {
  fuse::register_all();  // bn_fold; loading a graph checks that every transform it names is registered
  GraphModule m(build_model("lenet5"));
  q::Config c;
  c.method = "dorefa";
  c.weight_bits = 4;
  c.activation_bits = 32;
  q::apply(m, c);
  // A version-1 graph: the stack as the attributes weight_transform / folded_weight_transform.
  nlohmann::json j = nlohmann::json::parse(graph_to_json(m->graph()));
  ASSERT_EQ(j["version"], 2);
  j["version"] = 1;
  for (auto& n : j["nodes"]) {
    if (n["name"] != "conv2") continue;
    ASSERT_EQ(n["weight_transforms"], nlohmann::json::array({"dorefa"}));
    n.erase("weight_transforms");
    n["attrs"]["weight_transform"] = {{"type", "string"}, {"value", "bn_fold"}};
    n["attrs"]["folded_weight_transform"] = {{"type", "string"}, {"value", "dorefa"}};
  }
  const std::string text = j.dump(1);
  Graph g = graph_from_json(text);
  EXPECT_EQ(g.node("conv2").weight_transforms, (Names{"bn_fold", "dorefa"}));
  EXPECT_FALSE(g.node("conv2").has_attr("weight_transform"));
  EXPECT_FALSE(g.node("conv2").has_attr("folded_weight_transform"));
}

TEST(TransformStack, PushAndEraseKeepTheStackConsistent) {
  Node n = conv_node(2, 2, 1);
  push_weight_transform(n, "mask");
  EXPECT_THROW(push_weight_transform(n, "mask"), Error);    // already there
  EXPECT_THROW(push_weight_transform(n, "nope"), Error);    // unknown
  n.buffers.set("weight_mask", at::ones({2, 2, 3, 3}));
  EXPECT_TRUE(erase_weight_transform(n, "mask"));
  EXPECT_FALSE(n.buffers.contains("weight_mask"));  // the buffer it owns goes with it
  EXPECT_FALSE(erase_weight_transform(n, "mask"));
  EXPECT_EQ(transform_stack_problem(n), "");
}

}  // namespace
}  // namespace whittle::test
