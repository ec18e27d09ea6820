// ONNX and TorchScript export: hand-built graphs covering every op of the registry and every
// quantizer, run in onnxruntime and torch.jit.load by tests/reference/export_check.py (a Python
// process that imports nothing from whittle), and the named errors of bad input.
//
// Bounds (docs/export.md): ONNX max |difference| ≤ 1e-5 of the largest output on random inputs
// (all cases pass with 2 threads on AVX2 and with OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default;
// the sweep's worst is 1.9e-6, a 5× margin); TorchScript bitwise equal (same ATen calls, same
// process configuration).

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_number.h"
#include "export/checkpoint.h"
#include "export/onnx.h"
#include "export/torchscript_export.h"
#include "export/verify.h"
#include "export/writers.h"
#include "fuse/bn_threshold.h"
#include "fuse/fold_batchnorm.h"
#include "fuse/qat_batchnorm.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "quantize/quantize.h"
#include "support.h"
#include "test_models.h"

namespace whittle {
namespace {

using test::make;
using Json = nlohmann::json;

constexpr double kBound = 1e-5;

std::string out_dir() {
  const std::string d = join_path(test::binary_dir(), "testdata/export");
  make_directories(d);
  return d;
}

// Runs export_check.py on (file, check data) pairs; one JSON object per file.
std::vector<Json> run_reference(const std::vector<std::pair<std::string, std::string>>& files) {
  std::string cmd = "\"" + test::python_path() + "\" \"" + test::source_dir() + "/tests/reference/export_check.py\"";
  for (const auto& [f, d] : files) cmd += " \"" + f + "\" \"" + d + "\"";
  cmd += " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string text;
  char buf[4096];
  while (p && std::fgets(buf, sizeof(buf), p)) text += buf;
  const int rc = p ? pclose(p) : -1;
  EXPECT_EQ(rc, 0) << cmd << "\n" << text;
  std::vector<Json> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') out.push_back(Json::parse(line));
  EXPECT_EQ(out.size(), files.size()) << text;
  return out;
}

// Exports `g` as ONNX (at `opset`) and TorchScript with check data, runs both in their runtimes
// and checks the bounds. Returns the ONNX result (op counts, QuantizeLinear axes).
Json export_and_run(const Graph& g, const std::string& name, int64_t opset = 17, bool dynamic_batch = true) {
  const std::string dir = out_dir();
  const std::string onnx = join_path(dir, name + ".onnx"), ts = join_path(dir, name + ".pt"), data = join_path(dir, name + ".h5");
  OnnxOptions o;
  o.opset = opset;
  o.dynamic_batch = dynamic_batch;
  export_onnx(g, onnx, o);
  export_torchscript(g, ts);
  const int64_t batch = dynamic_batch ? 4 : g.value(g.inputs()[0]).shape[0];
  save_check_data(make_check_data(g, batch), g, data);
  // In C++ too: torch::jit::load of the file, against whittle's eval forward.
  const ExportCheck c = verify_torchscript_file(g, ts, batch);
  EXPECT_TRUE(c.bitwise_equal) << name << ": max |diff| " << c.max_abs_difference;
  std::vector<Json> r = run_reference({{onnx, data}, {ts, data}});
  if (r.size() != 2) return Json::object();
  EXPECT_LE(r[0]["relative"].get<double>(), kBound)
      << name << " onnxruntime: max |diff| " << r[0]["max_abs_difference"] << " of " << r[0]["max_abs_output"];
  EXPECT_TRUE(r[1]["bitwise_equal"].get<bool>()) << name << " torch.jit.load: max |diff| " << r[1]["max_abs_difference"];
  EXPECT_TRUE(r[1]["foreign_ops"].empty()) << name << ": TorchScript nodes outside aten:: and prim:: " << r[1]["foreign_ops"];
  return r[0];
}

int64_t count(const Json& r, const std::string& op) { return r["op_types"].value(op, int64_t{0}); }

Node with(Node n, std::initializer_list<std::pair<std::string, at::Tensor>> params) {
  for (const auto& [k, v] : params) n.params.set(k, v);
  return n;
}

Node batch_norm(const std::string& name, const std::string& input, int64_t c) {
  Node bn = make(name, "batch_norm", {input});
  bn.params.set("weight", at::rand({c}) + 0.5);
  bn.params.set("bias", at::randn({c}) * 0.3);
  bn.buffers.set("running_mean", at::randn({c}) * 0.5);
  bn.buffers.set("running_var", at::rand({c}) + 0.3);
  bn.buffers.set("num_batches_tracked", at::zeros({}, at::kLong));
  return bn;
}

// Every op of the registry but the quantize and fuse ones, with non-default attributes: two
// graph outputs (a tuple in TorchScript).
Graph op_zoo() {
  using V = std::vector<int64_t>;
  Graph g;
  g.add_input("x", {2, 4, 8, 8});
  g.add_node(with(make("conv", "conv2d", {"x"}, {{"padding", V{1, 1}}}), {{"weight", at::randn({8, 4, 3, 3}) * 0.3}, {"bias", at::randn({8})}}));
  g.add_node(batch_norm("bn", "conv", 8));
  std::string v = "bn";
  auto chain = [&](const std::string& name, const std::string& op, std::map<std::string, Attr> attrs = {}) {
    g.add_node(make(name, op, {v}, std::move(attrs)));
    v = name;
  };
  chain("hswish", "hardswish");
  chain("gelu", "gelu");
  chain("gelu_tanh", "gelu", {{"approximate", std::string("tanh")}});
  chain("silu", "silu");
  chain("leaky", "leaky_relu", {{"negative_slope", 0.2}});
  // RPReLU with shifts on both sides and a slope per channel, negative for some.
  g.add_node(with(make("rprelu", "rprelu", {v}), {{"shift_in", at::randn({8}) * 0.3},
                                                   {"slope", at::randn({8}) * 0.4},
                                                   {"shift_out", at::randn({8}) * 0.3}}));
  v = "rprelu";
  chain("relu6", "relu6");
  chain("htanh", "hardtanh", {{"min_val", -0.5}, {"max_val", 0.75}});
  chain("hsig", "hardsigmoid");
  chain("sig", "sigmoid");
  chain("tanh", "tanh");
  chain("relu", "relu");
  chain("drop", "dropout", {{"p", 0.3}});
  chain("fdrop", "feature_dropout");
  chain("ident", "identity");
  chain("shuffle", "channel_shuffle", {{"groups", int64_t{2}}});
  g.add_node(make("split", "split", {"shuffle"}, {{"split_sizes", V{3, 5}}}), 2);
  g.add_node(make("cat", "cat", {"split:1", "split:0"}));
  g.add_node(make("mul", "mul", {"cat", "ident"}));
  g.add_node(make("add", "add", {"mul", "bn"}));
  g.add_node(make("mpool", "max_pool2d", {"add"}, {{"kernel_size", int64_t{3}}, {"stride", int64_t{2}}, {"ceil_mode", int64_t{1}}}));
  g.add_node(make("apool", "avg_pool2d", {"mpool"},
                  {{"kernel_size", int64_t{3}}, {"stride", int64_t{1}}, {"padding", int64_t{1}}, {"count_include_pad", int64_t{0}}}));
  g.add_node(make("up_nearest", "upsample", {"apool"}, {{"scale_factor", std::vector<double>{2.0}}}));
  g.add_node(make("up_bilinear", "upsample", {"up_nearest"}, {{"mode", std::string("bilinear")}, {"size", V{5, 5}}}));
  g.add_node(make("up_align", "upsample", {"up_bilinear"},
                  {{"mode", std::string("bilinear")}, {"size", V{7, 7}}, {"align_corners", int64_t{1}}}));
  // 7 → 4 windows: the last one overhangs the input by one column and row.
  g.add_node(make("apool_ceil", "avg_pool2d", {"up_align"}, {{"kernel_size", int64_t{2}}, {"stride", int64_t{2}}, {"ceil_mode", int64_t{1}}}));
  g.add_node(with(make("deconv", "conv_transpose2d", {"up_align"},
                       {{"stride", int64_t{2}}, {"padding", int64_t{1}}, {"output_padding", int64_t{1}}, {"groups", int64_t{2}}}),
                  {{"weight", at::randn({8, 3, 3, 3}) * 0.3}, {"bias", at::randn({6})}}));
  g.add_node(make("adaptive", "adaptive_avg_pool2d", {"deconv"}, {{"output_size", V{7, 7}}}));
  g.add_node(make("tr", "transpose", {"adaptive"}, {{"dim0", int64_t{2}}, {"dim1", int64_t{3}}}));
  g.add_node(make("perm", "permute", {"tr"}, {{"dims", V{0, 1, 3, 2}}}));
  g.add_node(make("mean", "mean", {"perm"}, {{"dims", V{3}}}));
  g.add_node(with(make("fc3d", "linear", {"mean"}), {{"weight", at::randn({5, 7}) * 0.3}, {"bias", at::randn({5})}}));
  g.add_node(make("rs", "reshape", {"fc3d"}, {{"shape", V{3, 2, 5}}}));
  g.add_node(make("flat_part", "flatten", {"rs"}, {{"start_dim", int64_t{1}}, {"end_dim", int64_t{2}}}));
  g.add_node(make("flat", "flatten", {"flat_part"}));
  g.add_node(with(make("fc", "linear", {"flat"}), {{"weight", at::randn({10, 30}) * 0.2}, {"bias", at::randn({10})}}));
  g.add_node(make("softmax", "softmax", {"fc"}, {{"dim", int64_t{1}}}));
  g.set_outputs({"softmax", "apool_ceil"});
  return g;
}

class ExportTest : public test::SeededTest {};

// core/json_number.h, which the checkpoint's tensor index and graph structure are read through:
// what a JSON parser holds as a float or an out-of-range unsigned is an Error naming the key,
// never a conversion (undefined behaviour for a float past the integer's range).
TEST(JsonNumbers, IntegersOutsideTheirRangeAreNamedErrors) {
  using nlohmann::json;
  const json values = json::parse(R"([7, -3, 18446744073709551615, 9223372036854775807, 1e300,
                                      285555555555555555555555555, 2.5, "4", null, 4294967296])");
  EXPECT_EQ(json_int64(values[0], "k"), 7);
  EXPECT_EQ(json_int64(values[1], "k"), -3);
  EXPECT_EQ(json_int64(values[3], "k"), INT64_MAX);
  EXPECT_EQ(json_uint64(values[2], "k"), UINT64_MAX);
  EXPECT_EQ(json_uint64(values[0], "k", 7), 7u);
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (int i : {2, 4, 5, 6, 7, 8})
    EXPECT_EQ(message([&] { json_int64(values[i], "index: offset"); }).rfind("index: offset: expected an integer", 0), 0u)
        << values[i].dump();
  EXPECT_EQ(message([&] { json_uint64(values[1], "crc32"); }).rfind("crc32: expected an integer in [0, ", 0), 0u);
  EXPECT_EQ(message([&] { json_uint64(values[9], "crc32", UINT32_MAX); }),
            "crc32: expected an integer in [0, 4294967295], got 4294967296");
  EXPECT_EQ(message([&] { json_uint64(values[4], "n"); }), "n: expected an integer in [0, 18446744073709551615], got 1e+300");
  EXPECT_EQ(json_int64s(json::parse("[1, 2, 3]"), "shape"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(message([&] { json_int64s(json::parse("{}"), "shape"); }), "shape: expected a list of integers, got {}");
  EXPECT_EQ(message([&] { json_int64s(json::parse("[1, 1e300]"), "shape"); }),
            "shape: expected an integer in the 64-bit range, got 1e+300");
}

TEST_F(ExportTest, EveryRegisteredOpHasBothWriters) {
  register_export_writers();
  // conv_bn_qat is written as its base layer: deploy_graph finalizes it first (QatModelOnnxAndTorchScript).
  for (const std::string& k : registered_ops()) {
    if (k == "conv_bn_qat") continue;
    EXPECT_TRUE(onnx_forms().contains(k)) << k << " has no ONNX writer";
    EXPECT_TRUE(torchscript_forms().contains(k)) << k << " has no TorchScript writer";
  }
}

TEST_F(ExportTest, OpZooMatchesAtOpsets13And17) {
  const Graph g = op_zoo();
  const Json r17 = export_and_run(g, "op_zoo_opset17", 17);
  EXPECT_EQ(count(r17, "HardSwish"), 1);
  EXPECT_EQ(r17["input_dims"][0][0], "N");
  const Json r13 = export_and_run(g, "op_zoo_opset13", 13);
  EXPECT_EQ(r13["opset"], 13);
  EXPECT_EQ(count(r13, "HardSwish"), 0);  // opset 13: x·HardSigmoid(x)
  EXPECT_EQ(count(r13, "HardSigmoid"), 2);
  const Json fixed = export_and_run(g, "op_zoo_static", 17, /*dynamic_batch=*/false);
  EXPECT_EQ(fixed["input_dims"][0][0], 2);
}

TEST_F(ExportTest, BatchNormExportsInInferenceFormAndFusedHasNone) {
  // An eval model with BN(8) and random running statistics.
  Graph g;
  g.add_input("x", {1, 3, 6, 6});
  g.add_node(with(make("conv", "conv2d", {"x"}, {{"padding", int64_t{1}}}), {{"weight", at::randn({8, 3, 3, 3})}}));
  g.add_node(batch_norm("bn", "conv", 8));
  g.add_node(make("relu", "relu", {"bn"}));
  g.set_outputs({"relu"});
  const Json r = export_and_run(g, "batch_norm");
  EXPECT_EQ(count(r, "BatchNormalization"), 1);
  Graph fused = g.clone();
  fuse::fold_batchnorm(fused);
  const Json f = export_and_run(fused, "batch_norm_fused");
  EXPECT_EQ(count(f, "BatchNormalization"), 0);
  EXPECT_EQ(count(f, "Conv"), 1);
}

TEST_F(ExportTest, DoReFaW4TransposedConvIsQuantizedPerChannelOnAxis1) {
  Graph g;
  g.add_input("x", {1, 4, 5, 5});
  g.add_node(with(make("conv", "conv2d", {"x"}), {{"weight", at::randn({4, 4, 1, 1})}}));
  g.add_node(with(make("deconv", "conv_transpose2d", {"conv"}, {{"stride", int64_t{2}}}), {{"weight", at::randn({4, 6, 3, 3})}, {"bias", at::randn({6})}}));
  g.set_outputs({"deconv"});
  quantize::Config c;
  c.method = "dorefa";
  c.weight_bits = 4;
  c.activation_bits = 4;
  c.options["granularity"] = "per_channel";
  c.targets = {"deconv"};
  quantize::apply(g, c);
  const Json r = export_and_run(g, "dorefa_w4_deconv");
  bool weight = false, activation = false;
  for (const Json& q : r["dequantize_weights"]) {  // int8 codes, no float copy of the weight
    weight = true;
    EXPECT_EQ(q["axis"], 1) << q.dump();
    EXPECT_EQ(q["input_type"], "INT8");
    EXPECT_EQ(q["zero_point_type"], "INT8");
    EXPECT_EQ(q["feeds"][0], "ConvTranspose:1");
  }
  for (const Json& q : r["quantize_linear"]) {
    activation = true;
    EXPECT_EQ(q["zero_point_type"], "UINT8");
    EXPECT_EQ(q["input"], "Clip");
  }
  EXPECT_TRUE(weight && activation) << r.dump();
}

// conv1 (FP) → bn1 → relu → conv2 (DoReFa W2A2, clip 2, QAT BN: conv_bn_qat) → relu → conv3 (TWN)
// → bn3 → relu → conv4 (BNN, sign input: bn3 + sign becomes threshold_sign) → bn4 → relu → conv5
// (XNOR with K, sign input) → bn5 → relu → pool → fc (FP).
Graph every_quantizer() {
  Graph g;
  g.add_input("x", {1, 3, 8, 8});
  auto conv = [&](const std::string& name, const std::string& in, int64_t cin) {
    g.add_node(with(make(name, "conv2d", {in}, {{"padding", int64_t{1}}}), {{"weight", at::randn({8, cin, 3, 3}) * 0.4}, {"bias", at::randn({8}) * 0.1}}));
  };
  conv("conv1", "x", 3);
  g.add_node(batch_norm("bn1", "conv1", 8));
  g.add_node(make("relu1", "relu", {"bn1"}));
  conv("conv2", "relu1", 8);
  g.add_node(batch_norm("bn2", "conv2", 8));
  g.add_node(make("relu2", "relu", {"bn2"}));
  conv("conv3", "relu2", 8);
  g.add_node(batch_norm("bn3", "conv3", 8));
  g.add_node(make("relu3", "relu", {"bn3"}));
  conv("conv4", "relu3", 8);
  g.add_node(batch_norm("bn4", "conv4", 8));
  g.add_node(make("relu4", "relu", {"bn4"}));
  conv("conv5", "relu4", 8);
  g.add_node(batch_norm("bn5", "conv5", 8));
  g.add_node(make("relu5", "relu", {"bn5"}));
  g.add_node(make("pool", "adaptive_avg_pool2d", {"relu5"}, {{"output_size", std::vector<int64_t>{2, 2}}}));
  g.add_node(make("flat", "flatten", {"pool"}));
  g.add_node(with(make("fc", "linear", {"flat"}), {{"weight", at::randn({10, 32}) * 0.3}, {"bias", at::randn({10})}}));
  g.set_outputs({"fc"});
  auto apply = [&](const std::string& method, const std::string& target, int64_t wbits, int64_t abits, double clip, bool k) {
    quantize::Config c;
    c.method = method;
    c.weight_bits = wbits;
    c.activation_bits = abits;
    if (clip != 1.0) c.options["activation_clip"] = clip;
    if (k) c.options["xnor_scale_k"] = true;
    c.targets = {target};
    quantize::apply(g, c);
  };
  apply("dorefa", "conv2", 2, 2, 2.0, false);
  apply("twn", "conv3", 0, 0, 1.0, false);
  apply("bnn", "conv4", 0, 0, 1.0, false);
  apply("xnor", "conv5", 0, 0, 1.0, true);
  fuse::QatOptions q;
  q.targets = {"bn2"};
  fuse::prepare_qat_batchnorm(g, q);
  fuse::ThresholdOptions t;
  t.targets = {"bn3"};
  fuse::fold_bn_into_threshold(g, t);
  return g;
}

TEST_F(ExportTest, EveryQuantizerTypeMatchesInBothRuntimes) {
  Graph g = every_quantizer();
  std::set<std::string> ops;
  for (const Node& n : g.nodes()) ops.insert(n.op);
  for (const char* op : {"conv_bn_qat", "act_quant", "xnor_scale", "threshold_sign"}) EXPECT_TRUE(ops.count(op)) << op << "\n" << g;
  const Json r = export_and_run(g, "every_quantizer");
  EXPECT_GE(count(r, "Sign"), 2);  // the BNN input binarizer and the threshold, each Sign(2·Sign(x) + 1)
  EXPECT_GE(count(r, "QuantizeLinear"), 1);    // conv2's A2 activations
  EXPECT_GE(count(r, "DequantizeLinear"), 4);  // and the int8 codes of the W2, TWN, BNN and XNOR weights
  EXPECT_EQ(r["dequantize_weights"].size(), static_cast<size_t>(count(r, "DequantizeLinear") - count(r, "QuantizeLinear")));
  EXPECT_EQ(count(r, "BatchNormalization"), 3);  // bn1, bn4, bn5 (bn2 folded by QAT, bn3 into the threshold)

  // The packed checkpoint of the same model exports to bitwise the same TorchScript outputs.
  const std::string ck = join_path(out_dir(), "every_quantizer_checkpoint.h5");
  Graph deploy = g.clone();
  fuse::finalize_qat_batchnorm(deploy);  // checkpoints store the folded weight's codes
  save_checkpoint(ck, deploy);
  const Graph packed = load_checkpoint(ck).graph;
  const std::string ts = join_path(out_dir(), "every_quantizer_packed.pt");
  export_torchscript(packed, ts);
  EXPECT_TRUE(verify_torchscript_file(g, ts).bitwise_equal);
}

// Today's binary-network pieces: conv1 (FP) → bn1 → relu1 → conv2 (XNOR with Libra-PB, RSign
// input: relu1 also feeds the add, so RSign reads bn1) → bn2 → add(·, relu1) → RPReLU → conv3
// (RSign on the RPReLU's output) → bn3 → relu3 → conv4 (RSign in place of relu3, reading bn3
// alone) → bn4 → relu4 → pool → fc, with random learned thresholds. Exported as trained (act_quant
// rsign: Sub then the sign) and folded for deployment (bn3 + RSign one threshold, the other two
// RSigns thresholds of their own), both matching in onnxruntime and torch.jit.load, and the packed
// checkpoint's TorchScript bitwise.
TEST_F(ExportTest, BinaryNetworkPiecesMatchInBothRuntimes) {
  at::manual_seed(11);
  Graph g;
  g.add_input("x", {1, 3, 8, 8});
  auto conv = [&](const std::string& name, const std::string& in, int64_t cin) {
    g.add_node(with(make(name, "conv2d", {in}, {{"padding", int64_t{1}}}), {{"weight", at::randn({8, cin, 3, 3}) * 0.4}}));
  };
  conv("conv1", "x", 3);
  g.add_node(batch_norm("bn1", "conv1", 8));
  g.add_node(make("relu1", "relu", {"bn1"}));
  conv("conv2", "relu1", 8);
  g.add_node(batch_norm("bn2", "conv2", 8));
  g.add_node(make("add", "add", {"bn2", "relu1"}));
  g.add_node(with(make("rprelu", "rprelu", {"add"}), {{"shift_in", at::randn({8}) * 0.2},
                                                      {"slope", at::rand({8}) * 0.5},
                                                      {"shift_out", at::randn({8}) * 0.2}}));
  conv("conv3", "rprelu", 8);
  g.add_node(batch_norm("bn3", "conv3", 8));
  g.add_node(make("relu3", "relu", {"bn3"}));
  conv("conv4", "relu3", 8);
  g.add_node(batch_norm("bn4", "conv4", 8));
  g.add_node(make("relu4", "relu", {"bn4"}));
  g.add_node(make("pool", "adaptive_avg_pool2d", {"relu4"}, {{"output_size", std::vector<int64_t>{2, 2}}}));
  g.add_node(make("flat", "flatten", {"pool"}));
  g.add_node(with(make("fc", "linear", {"flat"}), {{"weight", at::randn({10, 32}) * 0.3}, {"bias", at::randn({10})}}));
  g.set_outputs({"fc"});
  quantize::Config c;
  c.method = "xnor";
  c.options["learned_threshold"] = true;
  c.options["weight_standardize"] = true;
  c.options["sign_gradient"] = std::string("approx_sign");
  c.targets = {"conv2", "conv3", "conv4"};
  quantize::apply(g, c);
  int64_t rsigns = 0;
  for (Node& n : g.nodes())
    if (n.op == "act_quant" && n.attr_str("method") == "rsign") {
      n.params.set("shift", at::randn({8}) * 0.3);
      ++rsigns;
    }
  ASSERT_EQ(rsigns, 3) << g;
  const Json trained = export_and_run(g, "binary_nets_trained");
  EXPECT_EQ(count(trained, "PRelu"), 1);

  Graph folded = g.clone();
  const fuse::Report r = fuse::fold_bn_into_threshold(folded);
  EXPECT_EQ(r.fused.size(), 3u) << r.summary();
  int64_t thresholds = 0;
  for (const Node& n : folded.nodes()) thresholds += n.op == "threshold_sign";
  EXPECT_EQ(thresholds, 3);
  EXPECT_FALSE(folded.find_node("bn3"));  // folded with conv4's RSign
  EXPECT_TRUE(folded.find_node("bn1"));   // relu1 reads it too: its RSign became a threshold alone
  export_and_run(folded, "binary_nets_folded");

  const std::string ck = join_path(out_dir(), "binary_nets_checkpoint.h5");
  save_checkpoint(ck, folded);
  const Graph packed = load_checkpoint(ck).graph;
  const std::string ts = join_path(out_dir(), "binary_nets_packed.pt");
  export_torchscript(packed, ts);
  EXPECT_TRUE(verify_torchscript_file(folded, ts).bitwise_equal);
}

// conv1 (FP) → bn → relu → conv2 (LSQ W4A4, per-channel steps) → bn → relu → conv3 (PACT W2A2) →
// bn → relu → conv4 (LSQ W8A8, 8-bit codes down to −128) → bn → relu → pool → fc (LSQ+ W4A3, an
// offset of −0.3 on its input), with the
// activation steps set from a batch (initialize_learned) and PACT's clip level at 1.7: the learned
// scales go into QuantizeLinear/DequantizeLinear exactly.
TEST_F(ExportTest, LearnedQuantizersMatchInBothRuntimes) {
  at::manual_seed(5);
  Graph g;
  g.add_input("x", {1, 3, 8, 8});
  std::string prev = "x";
  int64_t cin = 3;
  for (int i = 1; i <= 4; ++i) {
    const std::string c = "conv" + std::to_string(i), r = "relu" + std::to_string(i);
    g.add_node(with(make(c, "conv2d", {prev}, {{"padding", int64_t{1}}}),
                    {{"weight", at::randn({8, cin, 3, 3}) * 0.4}, {"bias", at::randn({8}) * 0.1}}));
    g.add_node(batch_norm("bn" + std::to_string(i), c, 8));
    g.add_node(make(r, "relu", {"bn" + std::to_string(i)}));
    prev = r;
    cin = 8;
  }
  g.add_node(make("pool", "adaptive_avg_pool2d", {prev}, {{"output_size", std::vector<int64_t>{2, 2}}}));
  g.add_node(make("flat", "flatten", {"pool"}));
  g.add_node(with(make("fc", "linear", {"flat"}), {{"weight", at::randn({10, 32}) * 0.3}, {"bias", at::randn({10})}}));
  g.set_outputs({"fc"});
  auto apply = [&](const std::string& method, const std::string& target, int64_t wbits, int64_t abits) {
    quantize::Config c;
    c.method = method;
    c.weight_bits = wbits;
    c.activation_bits = abits;
    if (method == "lsq" && wbits == 4) c.options["granularity"] = std::string("per_channel");
    if (method == "pact") c.options["clip_init"] = 1.7;
    c.targets = {target};
    quantize::apply(g, c);
  };
  apply("lsq", "conv2", 4, 4);
  apply("pact", "conv3", 2, 2);
  apply("lsq", "conv4", 8, 8);
  apply("lsq_plus", "fc", 4, 3);  // the last layer, named: its pooled input gets an offset
  GraphModule m(g);
  m->train();
  EXPECT_EQ(quantize::initialize_learned(m, at::randn({16, 3, 8, 8})), 3);  // LSQ and LSQ+ inputs; PACT starts from clip_init
  m->eval();
  {
    at::NoGradGuard no_grad;
    m->graph().node("fc.act_quant").params.at("act_offset").fill_(-0.3);  // a grid reaching below 0
  }
  const Graph& q = m->graph();
  EXPECT_EQ(q.node("conv2").params.at("weight_step").numel(), 8);  // per output channel
  const Json r = export_and_run(q, "learned_quantizers");
  EXPECT_EQ(count(r, "QuantizeLinear"), 4);    // four activations
  EXPECT_EQ(r["dequantize_weights"].size(), 4u);  // four weights as int8 codes
  EXPECT_GE(count(r, "Sub"), 1);             // LSQ+'s shift by its offset
  const std::string ck = join_path(out_dir(), "learned_quantizers.h5");
  save_checkpoint(ck, q);
  const std::string ts = join_path(out_dir(), "learned_quantizers_packed.pt");
  export_torchscript(load_checkpoint(ck).graph, ts);
  EXPECT_TRUE(verify_torchscript_file(q, ts).bitwise_equal);
}

// conv1 (FP) → bn → relu → conv2 (int8, uint8 activations after the ReLU: zero point 0) → bn →
// conv3 (int8, uint8 activations of a BN output: a zero point inside the range) → bn → relu →
// deconv (int8, transposed, weight scales along axis 1, int8 symmetric activations standing for
// the ReLU) → pool → fc (FP), calibrated by the entropy calibrator over two batches: the scales
// and zero points go into QuantizeLinear/DequantizeLinear exactly, with uint8 and int8 zero points.
TEST_F(ExportTest, Int8QuantizersMatchInBothRuntimes) {
  at::manual_seed(6);
  Graph g;
  g.add_input("x", {1, 3, 8, 8});
  g.add_node(with(make("conv1", "conv2d", {"x"}, {{"padding", int64_t{1}}}), {{"weight", at::randn({8, 3, 3, 3}) * 0.4}}));
  g.add_node(batch_norm("bn1", "conv1", 8));
  g.add_node(make("relu1", "relu", {"bn1"}));
  g.add_node(with(make("conv2", "conv2d", {"relu1"}, {{"padding", int64_t{1}}}),
                  {{"weight", at::randn({8, 8, 3, 3}) * 0.3}, {"bias", at::randn({8}) * 0.1}}));
  g.add_node(batch_norm("bn2", "conv2", 8));
  g.add_node(with(make("conv3", "conv2d", {"bn2"}, {{"groups", int64_t{2}}}), {{"weight", at::randn({8, 4, 1, 1}) * 0.5}}));
  g.add_node(batch_norm("bn3", "conv3", 8));
  g.add_node(make("relu3", "relu", {"bn3"}));
  g.add_node(with(make("deconv", "conv_transpose2d", {"relu3"}, {{"stride", int64_t{2}}}),
                  {{"weight", at::randn({8, 6, 2, 2}) * 0.3}, {"bias", at::randn({6}) * 0.1}}));
  g.add_node(make("pool", "adaptive_avg_pool2d", {"deconv"}, {{"output_size", std::vector<int64_t>{2, 2}}}));
  g.add_node(make("flat", "flatten", {"pool"}));
  g.add_node(with(make("fc", "linear", {"flat"}), {{"weight", at::randn({10, 24}) * 0.3}, {"bias", at::randn({10})}}));
  g.set_outputs({"fc"});
  quantize::Config c;
  c.method = "int8";
  c.options["calibrator"] = std::string("entropy");
  c.targets = {"conv2", "conv3"};
  quantize::apply(g, c);
  c.targets = {"deconv"};
  c.options["activation_dtype"] = std::string("int8");
  quantize::apply(g, c);
  GraphModule m(g);
  m->eval();
  const std::vector<at::Tensor> batches = {at::randn({8, 3, 8, 8}), at::randn({8, 3, 8, 8})};
  quantize::Calibration cal;
  cal.calibrator = "entropy";
  cal.batches = 2;
  EXPECT_EQ(quantize::calibrate_learned(m, [&](int64_t i) { return batches.at(static_cast<size_t>(i)); }, cal), 3);
  const Graph& q = m->graph();
  const Node& shifted = q.node("conv3.act_quant");
  EXPECT_GT(shifted.buffers.at("act_zero_point").item<float>(), 0.0f);  // BN outputs reach below 0
  EXPECT_LT(shifted.buffers.at("act_zero_point").item<float>(), 255.0f);
  EXPECT_EQ(q.node("deconv").attr_int("weight_axis"), 1);
  const Json r = export_and_run(q, "int8_quantizers");
  EXPECT_EQ(count(r, "QuantizeLinear"), 3);  // three activations
  ASSERT_EQ(r["dequantize_weights"].size(), 3u);  // three weights as int8 codes
  for (const Json& w : r["dequantize_weights"]) EXPECT_EQ(w["input_type"], "INT8") << w.dump();
  // Zero points of both activation types.
  std::set<std::string> zero_points;
  for (const Json& a : r["quantize_linear"]) zero_points.insert(a["zero_point_type"].get<std::string>());
  EXPECT_EQ(zero_points, (std::set<std::string>{"UINT8", "INT8"}));
  const std::string ck = join_path(out_dir(), "int8_quantizers.h5");
  save_checkpoint(ck, q);
  const Graph packed = load_checkpoint(ck).graph;
  export_and_run(packed, "int8_quantizers_packed");
  const std::string ts = join_path(out_dir(), "int8_quantizers_packed.pt");
  EXPECT_TRUE(verify_torchscript_file(q, ts).bitwise_equal);
}

// Forms where ONNX's own operator differs from PyTorch's: nearest sizes whose float ratio rounds
// differently (14 → 2, 14 → 16), bilinear to a length of 1, scale factors whose float product
// floors lower (14·0.7), max pooling in ceil mode with dilation and with a last window dropped, a
// transposed conv with output_padding ≥ stride.
TEST_F(ExportTest, EdgeCasesOfResizePoolingAndTransposedConvMatch) {
  using V = std::vector<int64_t>;
  Graph g;
  g.add_input("x", {1, 2, 14, 14});
  g.add_node(make("near2", "upsample", {"x"}, {{"size", V{2, 2}}}));
  g.add_node(make("near16", "upsample", {"x"}, {{"size", V{16, 16}}}));
  g.add_node(make("bilinear1", "upsample", {"x"}, {{"mode", std::string("bilinear")}, {"size", V{1, 1}}}));
  g.add_node(make("near07", "upsample", {"x"}, {{"scale_factor", std::vector<double>{0.7}}}));
  g.add_node(make("bilinear03", "upsample", {"x"}, {{"mode", std::string("bilinear")}, {"scale_factor", std::vector<double>{0.3}}}));
  g.add_node(make("pool_dilated", "max_pool2d", {"x"},
                  {{"kernel_size", int64_t{2}}, {"stride", int64_t{3}}, {"dilation", int64_t{3}}, {"ceil_mode", int64_t{1}}}));
  // 9 → 5 in ceil mode: the sixth window would start in the padding, PyTorch drops it, ONNX's ceil keeps it.
  g.add_node(make("pool_dropped", "max_pool2d", {"near07"},
                  {{"kernel_size", int64_t{2}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}, {"ceil_mode", int64_t{1}}}));
  g.add_node(with(make("deconv", "conv_transpose2d", {"x"},
                       {{"dilation", int64_t{2}}, {"padding", int64_t{1}}, {"output_padding", int64_t{1}}}),
                  {{"weight", at::randn({2, 3, 3, 3})}, {"bias", at::randn({3})}}));
  g.set_outputs({"near2", "near16", "bilinear1", "near07", "bilinear03", "pool_dilated", "pool_dropped", "deconv"});
  EXPECT_EQ(g.value("near07").shape, (Shape{1, 2, 9, 9}));
  EXPECT_EQ(g.value("pool_dropped").shape, (Shape{1, 2, 5, 5}));
  EXPECT_EQ(g.value("deconv").shape, (Shape{1, 3, 17, 17}));
  export_and_run(g, "edge_cases");
}

TEST_F(ExportTest, KeywordNodeNamesAreRefusedForTorchScript) {
  Graph g;
  g.add_input("x", {1, 3});
  g.add_node(with(make("in", "linear", {"x"}), {{"weight", at::randn({2, 3})}}));
  g.set_outputs({"in"});
  const std::string ts = join_path(out_dir(), "keyword.pt");
  remove_file(ts);
  try {
    export_torchscript(g, ts);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'in' (linear)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Python keyword"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(path_exists(ts));
  export_onnx(g, join_path(out_dir(), "keyword.onnx"));  // ONNX names may be anything
}

TEST_F(ExportTest, UnsupportedOpIsNamedAndNothingIsWritten) {
  OpTraits t;
  t.kind = "test_no_writer";
  t.description = "an op without export hooks";
  t.channel_flow = ChannelFlow::kPassThrough;
  t.forward = [](const Node&, const std::vector<at::Tensor>& in, bool) { return std::vector<at::Tensor>{in[0] * 2}; };
  t.infer_shapes = [](const Node&, const std::vector<Shape>& in) { return std::vector<Shape>{in[0]}; };
  register_op(t);
  Graph g;
  g.add_input("x", {1, 3});
  g.add_node(make("double_it", "test_no_writer", {"x"}));
  g.set_outputs({"double_it"});
  const std::string onnx = join_path(out_dir(), "unsupported.onnx"), ts = join_path(out_dir(), "unsupported.pt");
  remove_file(onnx);
  remove_file(ts);
  try {
    export_onnx(g, onnx);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'double_it' (test_no_writer)"), std::string::npos) << e.what();
  }
  try {
    export_torchscript(g, ts);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'double_it' (test_no_writer)"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(path_exists(onnx));
  EXPECT_FALSE(path_exists(ts));
}

TEST_F(ExportTest, AttributesWithoutAnOnnxFormAreNamed) {
  Graph g;
  g.add_input("x", {1, 2, 6, 6});
  g.add_node(make("pool", "avg_pool2d", {"x"}, {{"kernel_size", int64_t{2}}, {"divisor_override", int64_t{3}}}));
  g.set_outputs({"pool"});
  try {
    onnx_model_bytes(g);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'pool' (avg_pool2d): no ONNX form for divisor_override"), std::string::npos) << e.what();
  }
  Graph a;
  a.add_input("x", {1, 2, 5, 5});
  a.add_node(make("pool", "adaptive_avg_pool2d", {"x"}, {{"output_size", std::vector<int64_t>{2, 2}}}));
  a.set_outputs({"pool"});
  EXPECT_THROW(onnx_model_bytes(a), Error);
  // TorchScript has every form: the same graphs are exported and bitwise equal.
  const std::string ts = join_path(out_dir(), "divisor_override.pt");
  export_torchscript(g, ts);
  EXPECT_TRUE(verify_torchscript_file(g, ts).bitwise_equal);
}

TEST_F(ExportTest, OpsetOutsideTheSupportedRangeIsRefused) {
  const Graph g = test::small_net();
  for (int64_t opset : {12, 18}) {
    OnnxOptions o;
    o.opset = opset;
    try {
      onnx_model_bytes(g, o);
      FAIL() << "opset " << opset << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("13..17"), std::string::npos) << e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    }
  }
}

TEST_F(ExportTest, ExportKeepsNodeNamesAndStateDictKeys) {
  const Graph g = test::small_net();
  const std::string ts = join_path(out_dir(), "small_net.pt");
  export_torchscript(g, ts);
  const std::string src = torchscript_source(g);
  EXPECT_NE(src.find("torch.conv2d("), std::string::npos) << src;
  EXPECT_NE(src.find("getattr(getattr(self, \"features\"), \"0\")"), std::string::npos) << src;
  // ONNX node names are whittle's; initializers are "<node>.<tensor>".
  const std::string bytes = onnx_model_bytes(g);
  for (const char* name : {"features.0", "features.1", "classifier", "features.0.weight", "features.1.running_var"})
    EXPECT_NE(bytes.find(name), std::string::npos) << name;
  const std::string onnx = join_path(out_dir(), "small_net.onnx");
  export_onnx(g, onnx);
  EXPECT_EQ(check_onnx_file(onnx), 6);
}

TEST_F(ExportTest, CorruptOnnxFileIsNamed) {
  const std::string bad = join_path(out_dir(), "corrupt.onnx");
  write_file_atomic(bad, "not a protobuf \x01\x02\x03");
  try {
    check_onnx_file(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace whittle
