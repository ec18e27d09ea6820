// Graph IR, op registry and GraphModule: structure, shapes, costs, and numerics against ATen.

#include <torch/nn/modules/conv.h>

#include "core/error.h"
#include "graph/graph.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "graph/serialize.h"
#include "support.h"
#include "test_models.h"

namespace whittle {
namespace {

using test::all_close;

class GraphTest : public test::SeededTest {};

using test::make;

using test::small_net;

TEST_F(GraphTest, ShapesAndCostsOfSmallNet) {
  Graph g = small_net();
  EXPECT_EQ(g.value("features.0").shape, (Shape{2, 8, 8, 8}));
  EXPECT_EQ(g.value("features.3").shape, (Shape{2, 8, 4, 4}));
  EXPECT_EQ(g.value("flatten").shape, (Shape{2, 128}));
  EXPECT_EQ(g.value("classifier").shape, (Shape{2, 10}));
  // conv: 2·8·8·8 outputs × 3·3·3 = 27,648 MACs; linear: 2·128·10 = 2,560.
  EXPECT_EQ(node_cost(g, g.node("features.0")).macs, 27648);
  EXPECT_EQ(node_cost(g, g.node("classifier")).macs, 2560);
  NodeCost total = graph_cost(g);
  EXPECT_EQ(total.macs, 27648 + 2560);
  EXPECT_EQ(total.params, 8 * 27 + 8 + 8 + 8 + 1280 + 10);
}

TEST_F(GraphTest, ForwardMatchesAtenInEvalAndTrain) {
  Graph g = small_net();
  Graph ref = g.clone();
  GraphModule m(std::move(g));
  at::Tensor x = at::randn({5, 3, 8, 8});
  auto run_ref = [&](bool training) {
    const Node& c = ref.node("features.0");
    const Node& b = ref.node("features.1");
    const Node& f = ref.node("classifier");
    at::Tensor y = at::conv2d(x, c.params.at("weight"), c.params.at("bias"), 1, 1);
    y = at::batch_norm(y, b.params.at("weight"), b.params.at("bias"), b.buffers.at("running_mean"),
                       b.buffers.at("running_var"), training, 0.1, 1e-5, false);
    y = at::max_pool2d(at::relu(y), {2, 2});
    return at::linear(y.flatten(1), f.params.at("weight"), f.params.at("bias"));
  };
  m->eval();
  EXPECT_TRUE(all_close(m->forward(x), run_ref(false), 1e-6, 1e-5));
  m->train();
  at::Tensor out = m->forward(x);
  EXPECT_TRUE(all_close(out, run_ref(true), 1e-6, 1e-5));
  // Running statistics were updated identically, and num_batches_tracked counted the batch.
  EXPECT_TRUE(all_close(m->graph().node("features.1").buffers.at("running_mean"),
                        ref.node("features.1").buffers.at("running_mean"), 1e-7, 1e-6));
  EXPECT_EQ(m->graph().node("features.1").buffers.at("num_batches_tracked").item<int64_t>(), 1);
  // Gradients reach every parameter.
  out.sum().backward();
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
}

TEST_F(GraphTest, StateDictNamesFollowNodeNames) {
  GraphModule m(small_net());
  std::vector<std::string> params, buffers;
  for (const auto& p : m->named_parameters()) params.push_back(p.key());
  for (const auto& b : m->named_buffers()) buffers.push_back(b.key());
  EXPECT_EQ(params, (std::vector<std::string>{"features.0.weight", "features.0.bias", "features.1.weight",
                                              "features.1.bias", "classifier.weight", "classifier.bias"}));
  EXPECT_EQ(buffers, (std::vector<std::string>{"features.1.running_mean", "features.1.running_var",
                                               "features.1.num_batches_tracked"}));
}

TEST_F(GraphTest, ToDtypeKeepsIntegerBuffersAndSharesTensors) {
  GraphModule m(small_net());
  m->to(at::kDouble);
  EXPECT_EQ(m->named_parameters()["features.0.weight"].scalar_type(), at::kDouble);
  EXPECT_EQ(m->graph().node("features.0").params.at("weight").scalar_type(), at::kDouble);
  EXPECT_EQ(m->named_buffers()["features.1.num_batches_tracked"].scalar_type(), at::kLong);
  // The optimizer-visible parameter and the node tensor are one object.
  EXPECT_TRUE(m->named_parameters()["classifier.weight"].is_same(m->graph().node("classifier").params.at("weight")));
  at::Tensor y = m->forward(at::randn({1, 3, 8, 8}, at::kDouble));
  EXPECT_EQ(y.scalar_type(), at::kDouble);
}

TEST_F(GraphTest, IntermediatesAreCaptured) {
  GraphModule m(small_net());
  m->eval();
  std::map<std::string, at::Tensor> cap;
  at::Tensor x = at::randn({1, 3, 8, 8});
  auto out = m->forward_with_intermediates({x}, {"features.2", "flatten"}, &cap);
  ASSERT_EQ(cap.size(), 2u);
  EXPECT_EQ(cap["features.2"].sizes(), (at::IntArrayRef{1, 8, 8, 8}));
  EXPECT_GE(cap["features.2"].min().item<double>(), 0.0);
  EXPECT_THROW(m->forward_with_intermediates({x}, {"nope"}, &cap), Error);
}

TEST_F(GraphTest, ShapeMismatchNamesTheNode) {
  Graph g;
  g.add_input("x", {1, 4, 8, 8});
  Node conv = make("block.conv", "conv2d", {"x"});
  conv.params.set("weight", at::randn({8, 3, 3, 3}));
  try {
    g.add_node(conv);
    FAIL() << "expected whittle::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("block.conv"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4 channels"), std::string::npos) << msg;
  }
}

TEST_F(GraphTest, ValidateFindsDanglingAndOutOfOrderValues) {
  Graph g = small_net();
  g.node("features.2").inputs = {"ghost"};
  EXPECT_THROW(g.validate(), Error);
  Graph h = small_net();
  h.node("features.1").inputs = {"features.2"};  // uses a later value: a cycle in dataflow terms
  try {
    h.validate();
    FAIL() << "expected whittle::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("used before it is produced"), std::string::npos) << e.what();
  }
}

TEST_F(GraphTest, EditingKeepsTheGraphConsistent) {
  Graph g = small_net();
  // Insert an identity after relu and route the pool through it.
  g.insert_node_before("features.3", make("extra", "identity", {"features.2"}));
  g.replace_all_uses("features.2", "extra", "extra");
  EXPECT_EQ(g.node("features.3").inputs, (std::vector<std::string>{"extra"}));
  EXPECT_EQ(g.users("features.2"), (std::vector<std::string>{"extra"}));
  EXPECT_NO_THROW(g.validate());
  EXPECT_THROW(g.remove_node("extra"), Error);  // still used
  g.replace_all_uses("extra", "features.2");
  g.remove_node("extra");
  EXPECT_NO_THROW(g.validate());
  EXPECT_EQ(g.unique_name("flatten"), "flatten_1");
  EXPECT_EQ(g.unique_name("fresh"), "fresh");
}

TEST_F(GraphTest, TextFormIsDeterministic) {
  Graph g = small_net();
  std::string text = g.to_string();
  EXPECT_EQ(text, small_net().to_string());
  EXPECT_NE(text.find("%features.0 = conv2d(%x) {padding=[1, 1]} params{weight[8, 3, 3, 3], bias[8]} -> [2, 8, 8, 8]"),
            std::string::npos)
      << text;
}

TEST_F(GraphTest, UnknownOpListsKnownOps) {
  try {
    op_traits("conv3d");
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("conv3d"), std::string::npos);
    EXPECT_NE(msg.find("conv2d"), std::string::npos);
  }
}

TEST_F(GraphTest, WeightTransformReplacesTheWeightAndPassesGradients) {
  WeightTransform doubled;
  doubled.name = "test_double";
  doubled.description = "2·w";
  doubled.kind = TransformKind::kQuantizer;
  doubled.apply = [](const Node&, const at::Tensor& w, bool) { return w * 2.0; };
  register_weight_transform(std::move(doubled));
  Graph g = small_net();
  Graph plain = g.clone();
  g.node("classifier").weight_transforms = {"test_double"};
  GraphModule m(g);
  m->eval();
  at::Tensor x = at::randn({2, 3, 8, 8});
  // Reference: the same net with the classifier weight doubled by hand.
  plain.node("classifier").params.set("weight", plain.node("classifier").params.at("weight") * 2.0);
  GraphModule ref(plain);
  ref->eval();
  EXPECT_TRUE(all_close(m->forward(x), ref->forward(x), 1e-6, 1e-6));
  // The latent weight is untouched and receives the chain-rule gradient 2·(dL/dw').
  m->forward(x).sum().backward();
  std::map<std::string, at::Tensor> cap;
  ref->forward_with_intermediates({x}, {"flatten"}, &cap);
  at::Tensor expected = 2.0 * at::ones({2, 10}).t().mm(cap["flatten"]);
  EXPECT_TRUE(all_close(m->named_parameters()["classifier.weight"].grad(), expected, 1e-5, 1e-5));
  // An unknown transform is named when the module is built.
  g.node("classifier").weight_transforms = {"nope"};
  try {
    GraphModule bad(g);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown weight transform 'nope'"), std::string::npos) << e.what();
  }
}

// The message of the whittle::Error `fn` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(GraphTest, AttributesReadTheirDeclaredDefaults) {
  Graph g = small_net();
  const Node& conv = g.node("features.0");
  // conv2d declares groups = 1, stride = dilation = [1, 1]; padding was set.
  EXPECT_EQ(conv.attr_int("groups"), 1);
  EXPECT_EQ(conv.attr_pair("stride"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(conv.attr_pair("dilation"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(conv.attr_pair("padding"), (std::vector<int64_t>{1, 1}));
  EXPECT_DOUBLE_EQ(g.node("features.1").attr_float("eps"), 1e-5);
  EXPECT_DOUBLE_EQ(g.node("features.1").attr_float("momentum"), 0.1);
  EXPECT_EQ(g.node("flatten").attr_int("start_dim"), 1);
  EXPECT_EQ(g.node("flatten").attr_int("end_dim"), -1);
  EXPECT_FALSE(g.node("features.3").attr_bool("ceil_mode"));
  // A key no declaration names, and a declared one without a default, are errors naming both.
  EXPECT_EQ(error_of([&] { conv.attr_int("group"); }), "node 'features.0' (conv2d): no attribute 'group' is declared for it");
  EXPECT_EQ(error_of([&] { g.node("features.3").attr_pair("stride"); }),
            "node 'features.3' (max_pool2d): missing attribute 'stride'");
  // A linear layer has no groups: the channel model says so (channel_groups), not a default.
  EXPECT_EQ(channel_groups(g.node("classifier")), 1);
  EXPECT_EQ(channel_groups(conv), conv.attr_int("groups"));
  EXPECT_THROW(g.node("classifier").attr_int("groups"), Error);
  // The declaration as `whittle inspect --ops` lists it.
  EXPECT_EQ(attr_spec(conv, "stride")->summary(), "pair, default [1, 1], at least 1");
  EXPECT_EQ(attr_spec(g.node("features.1"), "momentum")->summary(), "float, default 0.1, at most 1");
}

TEST_F(GraphTest, AttributesAreCheckedAgainstTheirDeclarations) {
  Graph g = small_net();
  auto add_conv = [&](std::map<std::string, Attr> attrs) {
    Graph h = small_net();
    Node c = make("extra", "conv2d", {"features.0"}, std::move(attrs));
    c.params.set("weight", at::randn({8, 8, 1, 1}));
    return error_of([&] { h.add_node(c); });
  };
  EXPECT_EQ(add_conv({{"stride", std::vector<int64_t>{0, 1}}}),
            "node 'extra' (conv2d): attribute 'stride' is [0, 1], below the minimum 1");
  EXPECT_EQ(add_conv({{"groups", int64_t{0}}}), "node 'extra' (conv2d): attribute 'groups' is 0, below the minimum 1");
  EXPECT_EQ(add_conv({{"groups", 1.5}}), "node 'extra' (conv2d): attribute 'groups' is 1.5, not an integer");
  EXPECT_EQ(add_conv({{"stride", std::vector<int64_t>{1, 1, 1}}}),
            "node 'extra' (conv2d): attribute 'stride' is [1, 1, 1], not an integer or a list of 1 or 2 integers");
  EXPECT_EQ(add_conv({{"strides", std::vector<int64_t>{1, 1}}}),
            "node 'extra' (conv2d): unknown attribute 'strides' (it declares stride, padding, dilation, groups)");
  EXPECT_EQ(add_conv({}), "");
  // Strings against their choices, booleans against 0 and 1, fractions against their range.
  Node gelu = make("g", "gelu", {"features.0"}, {{"approximate", std::string("erf")}});
  EXPECT_EQ(error_of([&] { g.add_node(gelu); }), "node 'g' (gelu): attribute 'approximate' is 'erf', not one of none, tanh");
  Node drop = make("d", "dropout", {"features.0"}, {{"p", 1.5}});
  EXPECT_EQ(error_of([&] { g.add_node(drop); }), "node 'd' (dropout): attribute 'p' is 1.5, above the maximum 1");
  Node pool = make("p", "max_pool2d", {"features.0"}, {{"kernel_size", int64_t{2}}, {"ceil_mode", int64_t{2}}});
  EXPECT_EQ(error_of([&] { g.add_node(pool); }), "node 'p' (max_pool2d): attribute 'ceil_mode' is 2, not 0 or 1");
  // Required attributes must be there.
  Node pool2 = make("p2", "max_pool2d", {"features.0"});
  EXPECT_EQ(error_of([&] { g.add_node(pool2); }), "node 'p2' (max_pool2d): missing attribute 'kernel_size'");
  // A node edited after it was added is refused by validate(), which every load runs.
  g.node("features.3").attrs["padding"] = int64_t{-1};
  EXPECT_EQ(error_of([&] { g.validate(); }), "node 'features.3' (max_pool2d): attribute 'padding' is -1, below the minimum 0");
  g.node("features.3").attrs.erase("padding");
  // The transform stack: a name twice is refused.
  g.node("features.0").weight_transforms = {"mask", "mask"};
  g.node("features.0").buffers.set("weight_mask", at::ones({8, 3, 3, 3}));
  EXPECT_EQ(error_of([&] { g.validate(); }),
            "node 'features.0' (conv2d): weight transform 'mask' appears twice in its stack");
}

TEST_F(GraphTest, StructureRoundTripsThroughJson) {
  // Attributes of every type: "note" and "scales" are declared here, as a module declares the
  // annotations it writes on nodes of any op.
  register_node_annotation(AttrSpec::optional("note", AttrType::kString, "test: a string attribute"));
  register_node_annotation(AttrSpec::optional("scales", AttrType::kFloats, "test: a float list attribute"));
  Graph g = small_net();
  g.node("features.3").attrs["ceil_mode"] = int64_t{0};
  g.node("features.2").attrs["note"] = std::string("kept");
  g.node("features.2").attrs["scales"] = std::vector<double>{0.5, 2.0};
  const std::string text = graph_to_json(g);
  // Tensors come back from the source by (node, role, name); here from the original graph.
  TensorSource from_original = [&](const std::string& node, TensorRole role, const std::string& name, const Shape&,
                                   at::ScalarType) {
    const Node& n = g.node(node);
    return (role == TensorRole::kParam ? n.params : n.buffers).at(name).detach().clone();
  };
  Graph back = graph_from_json(text, from_original, "test.json");
  EXPECT_EQ(back.to_string(), g.to_string());
  EXPECT_EQ(graph_to_json(back), text);
  EXPECT_TRUE(std::holds_alternative<std::vector<double>>(back.node("features.2").attrs.at("scales")));
  GraphModule a(g), b(back);
  a->eval();
  b->eval();
  at::Tensor x = at::randn({3, 3, 8, 8});
  EXPECT_TRUE(all_close(b->forward(x), a->forward(x), 0, 0));
  // Without a source, tensors are zero-filled with the recorded shapes and dtypes.
  Graph zeros = graph_from_json(text);
  EXPECT_EQ(zeros.node("features.1").buffers.at("num_batches_tracked").scalar_type(), at::kLong);
  EXPECT_EQ(zeros.node("classifier").params.at("weight").sizes(), (at::IntArrayRef{10, 128}));
}

TEST_F(GraphTest, MalformedStructureGivesNamedErrors) {
  const std::string text = graph_to_json(small_net());
  auto message_of = [](const std::string& t, const TensorSource& src = {}) {
    try {
      graph_from_json(t, src, "model.h5");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of("{not json").find("model.h5: graph structure is not valid JSON"), std::string::npos);
  std::string newer = text;
  newer.replace(newer.find("\"version\": 2"), 12, "\"version\": 9");
  EXPECT_NE(message_of(newer).find("newer than this whittle understands"), std::string::npos) << message_of(newer);
  std::string unknown_op = text;
  unknown_op.replace(unknown_op.find("\"relu\""), 6, "\"relu9\"");
  EXPECT_NE(message_of(unknown_op).find("relu9"), std::string::npos) << message_of(unknown_op);
  // A tensor source that returns the wrong shape is caught and named.
  TensorSource wrong = [](const std::string&, TensorRole, const std::string&, const Shape& shape, at::ScalarType dt) {
    Shape s = shape;
    if (!s.empty()) s[0] += 1;
    return at::zeros(s, at::TensorOptions().dtype(dt));
  };
  std::string msg = message_of(text, wrong);
  EXPECT_NE(msg.find("node 'features.0' tensor 'weight': expected float32 [8, 3, 3, 3]"), std::string::npos) << msg;
  // A graph with no outputs (the top-level list, the last "outputs" key, emptied) or no inputs is
  // a damaged file, not a model (fuzz finding: every command took it, export wrote an ONNX file
  // with no outputs).
  std::string no_outputs = text;
  const size_t at = no_outputs.rfind("\"outputs\":");
  ASSERT_NE(at, std::string::npos);
  no_outputs.replace(at, no_outputs.find(']', at) + 1 - at, "\"outputs\": []");
  EXPECT_EQ(message_of(no_outputs), "model.h5: the graph has no outputs");
  // With no inputs, any node's input is undefined; a graph of no nodes reaches the check itself.
  EXPECT_EQ(message_of(R"({"format": "whittle.graph", "version": 2, "inputs": [], "nodes": [], "outputs": []})"),
            "model.h5: the graph has no inputs");
  // Integers a JSON parser cannot hold as int64 (a literal too long for 64 bits is read as a
  // float, whose conversion to an integer would be undefined behaviour; an unsigned past INT64_MAX
  // would wrap) are named, in an input's shape, a tensor's shape, an attribute and the version
  // (fuzz finding: tests/fuzz/regressions/graph_json/).
  const std::string input_shape = "\"shape\": [\n    2,\n    3,\n    8,\n    8\n   ]";
  ASSERT_NE(text.find(input_shape), std::string::npos) << text.substr(0, 300);
  for (const std::string& bad : {std::string("285555555555555555555555555"), std::string("1e300"),
                                 std::string("9223372036854775808"), std::string("2.5")}) {
    std::string t = text;
    t.replace(t.find(input_shape), input_shape.size(), "\"shape\": [2, " + bad + ", 8, 8]");
    msg = message_of(t);
    EXPECT_NE(msg.find("model.h5 inputs: shape: expected an integer in the 64-bit range, got "), std::string::npos)
        << bad << ": " << msg;
  }
  std::string version = text;
  version.replace(version.find("\"version\": 2"), 12, "\"version\": 1e300");
  EXPECT_NE(message_of(version).find("model.h5: version: expected an integer in the 64-bit range, got 1e+300"),
            std::string::npos)
      << message_of(version);
  // features.0's weight [8, 3, 3, 3]: its first dimension replaced.
  std::string tensor_shape = text;
  const size_t w = tensor_shape.find("\"shape\": [", tensor_shape.find("\"params\""));
  ASSERT_NE(w, std::string::npos);
  const size_t eight = tensor_shape.find('8', w);
  ASSERT_EQ(tensor_shape.find_first_not_of(" \n", w + 10), eight);
  tensor_shape.replace(eight, 1, "9223372036854775809");
  msg = message_of(tensor_shape);
  EXPECT_NE(msg.find("node 'features.0' tensor 'weight': shape: expected an integer in the 64-bit range, got 9223372036854775809"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace whittle
