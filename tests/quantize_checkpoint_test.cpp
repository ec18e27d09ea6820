// Packed checkpoints: quantized layers store packed codes and scales (never float weights),
// reload to bitwise the same eval outputs, re-save the same codes, and are small.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>

#include <torch/optim/sgd.h>

#include <cstdlib>

#include "export/checkpoint.h"
#include "core/file_util.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "quantize/pack.h"
#include "quantize/quantize.h"
#include "support.h"

namespace whittle::test {
namespace {

namespace q = whittle::quantize;

std::string scratch(const std::string& name) {
  const std::string dir = join_path(binary_dir(), "testdata/quantize");
  make_directories(dir);
  return join_path(dir, name);
}

q::Config config(const std::string& method, int64_t wb = 0, int64_t ab = 0) {
  q::Config c;
  c.method = method;
  c.weight_bits = wb;
  c.activation_bits = ab;
  return c;
}

// A few SGD steps on random data, so that BN statistics and weights move away from their init.
// `c`: the configuration the model was quantized with (its method clips BNN latent weights).
void train_a_little(GraphModule& m, const Shape& in, const q::Config& c, int steps = 3) {
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  m->train();
  for (int i = 0; i < steps; ++i) {
    at::Tensor x = at::randn({8, in[1], in[2], in[3]});
    at::Tensor y = at::randint(0, 10, {8});
    at::Tensor loss = at::cross_entropy_loss(m->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    q::after_step(m->graph(), q::resolve(c));
  }
  m->eval();
}

// Whether the checkpoint stores tensor `node.name` (its /tensors/index lists it).
bool tensor_stored(const std::string& path, const std::string& name) {
  const auto names = checkpoint_tensor_names(path);
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Theoretical size: `bits` per quantized weight plus 32 bits per other stored value (every other
// parameter and buffer element, scales included).
double theoretical_bytes(const Graph& packed) {
  double bits = 0;
  for (const auto& n : packed.nodes()) {
    for (const auto& kv : n.params) bits += 32.0 * static_cast<double>(kv.second.numel());
    for (const auto& kv : n.buffers) {
      if (kv.first == "weight_codes") {
        int64_t count = 1;
        for (int64_t d : n.attr_ints("weight_shape")) count *= d;
        bits += static_cast<double>(count * n.attr_int("weight_bits"));
      } else {
        bits += 32.0 * static_cast<double>(kv.second.numel());
      }
    }
  }
  return bits / 8;
}

class PackedCheckpoint : public SeededTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(PackedCheckpoint, ReloadsBitwiseAndStoresNoFloatWeights) {
  const std::string method = GetParam();
  GraphModule m(build_model("lenet5"));
  // "<method>" alone, or "<method>_w<W>a<A>[_suffix]".
  const size_t w = method.find("_w");
  q::Config c = w == std::string::npos
                    ? config(method)
                    : config(method.substr(0, w), std::stoll(method.substr(w + 2)), std::stoll(method.substr(method.find('a', w) + 1)));
  if (method == "dorefa_w2a2_clip2") c.options["activation_clip"] = 2.0;
  q::apply(m, c);
  train_a_little(m, {1, 1, 28, 28}, c);
  at::Tensor x = at::randn({16, 1, 28, 28});
  at::Tensor expected;
  {
    at::NoGradGuard ng;
    expected = m->forward(x);
  }
  const std::string path = scratch(method + ".h5");
  save_checkpoint(path, m->graph());
  EXPECT_FALSE(tensor_stored(path, "conv2.weight"));
  EXPECT_TRUE(tensor_stored(path, "conv2.weight_codes"));
  EXPECT_TRUE(tensor_stored(path, "conv1.weight"));  // first layer: full precision

  Checkpoint ck = load_checkpoint(path);
  const Node& conv2 = ck.graph.node("conv2");
  EXPECT_EQ(conv2.weight_transforms, std::vector<std::string>{"packed"});
  EXPECT_FALSE(conv2.params.contains("weight"));
  EXPECT_EQ(conv2.buffers.at("weight_codes").scalar_type(), at::kByte);
  if (c.options.contains("activation_clip"))  // the clip level travels with the act_quant node
    EXPECT_DOUBLE_EQ(ck.graph.node("conv2.act_quant").attr_float("activation_clip"), 2.0);
  GraphModule loaded(ck.graph);
  loaded->eval();
  at::NoGradGuard ng;
  at::Tensor got = loaded->forward(x);
  EXPECT_TRUE(got.equal(expected)) << "max |diff| " << (got - expected).abs().max().item<double>();

  // Re-saving writes the same codes (never re-quantizes the decoded weight).
  const std::string again = scratch(method + "_resaved.h5");
  save_checkpoint(again, loaded->graph());
  Checkpoint ck2 = load_checkpoint(again);
  for (const auto& n : ck.graph.nodes()) {
    if (!n.buffers.contains("weight_codes")) continue;
    EXPECT_TRUE(ck2.graph.node(n.name).buffers.at("weight_codes").equal(n.buffers.at("weight_codes"))) << n.name;
    EXPECT_TRUE(ck2.graph.node(n.name).buffers.at("weight_scale").equal(n.buffers.at("weight_scale"))) << n.name;
  }
  GraphModule reloaded(ck2.graph);
  reloaded->eval();
  EXPECT_TRUE(reloaded->forward(x).equal(expected));
}

INSTANTIATE_TEST_SUITE_P(Methods, PackedCheckpoint,
                         ::testing::Values("dorefa", "dorefa_w4a4", "dorefa_w2a2", "dorefa_w2a2_clip2", "twn", "bnn", "xnor",
                                           "lsq_w3a3", "lsq_w5a5", "dorefa_w6a6"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// The weight a packed node decodes to is the trained model's quantized weight, bit for bit; for
// DoReFa 4-bit, quantizing that again would differ (the reason checkpoints hold codes).
TEST(PackedCheckpointTest, DecodesTheTrainedWeightNotARequantization) {
  GraphModule m(build_model("lenet5"));
  q::apply(m, config("dorefa", 4, 32));
  Graph packed = q::pack_graph(m->graph());
  const Node& fc1 = m->graph().node("fc1");
  at::Tensor trained = transformed_weight(fc1, false);
  at::Tensor decoded = q::decode_packed_weight(packed.node("fc1"));
  EXPECT_TRUE(decoded.equal(trained));
  EXPECT_FALSE(q::dorefa_weight(trained, 4).equal(trained));
}

// Bytes of tensor data stored in the file (the /tensors/data dataset), without HDF5 metadata.
double tensor_data_bytes(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "tensors/data", H5P_DEFAULT);
  const double total = static_cast<double>(H5Dget_storage_size(ds));
  H5Dclose(ds);
  H5Fclose(f);
  return total;
}

// ResNet-20, W2A2, BNN and LSQ W3A3 (3-bit codes packed without gaps): the stored tensor data is the theoretical size (packing really packs:
// ≤ 1.05×, the slack being int64 counters and 8-byte alignment), the whole file (graph, index,
// HDF5 metadata included) is ≤ 1.3× theoretical, and the file reloads bitwise.
TEST(PackedCheckpointTest, ResNet20FileSize) {
  for (const auto& [name, cfg] : {std::pair<std::string, q::Config>{"resnet20_w2a2", config("dorefa", 2, 2)},
                                  std::pair<std::string, q::Config>{"resnet20_bnn", config("bnn")},
                                  std::pair<std::string, q::Config>{"resnet20_lsq_w3a3", config("lsq", 3, 3)}}) {
    GraphModule m(build_model("resnet20"));
    q::apply(m, cfg);
    train_a_little(m, {1, 3, 32, 32}, cfg, 1);
    const std::string path = scratch(name + ".h5");
    save_checkpoint(path, m->graph());
    const double theory = theoretical_bytes(q::pack_graph(m->graph()));
    const double data = tensor_data_bytes(path);
    const double real = static_cast<double>(file_size(path));
    std::cout << name << ": tensor data " << data << " bytes, file " << real << " bytes, theoretical " << theory
              << " bytes, file/theoretical " << real / theory << "\n";
    EXPECT_LE(data, 1.05 * theory) << name;
    EXPECT_LE(real, 1.3 * theory) << name;
    at::Tensor x = at::randn({4, 3, 32, 32});
    at::NoGradGuard ng;
    at::Tensor expected = m->forward(x);
    GraphModule loaded(load_checkpoint(path).graph);
    loaded->eval();
    EXPECT_TRUE(loaded->forward(x).equal(expected)) << name;
  }
}

// Checkpoints written when 3-bit codes were stored in 4-bit fields and 5- to 7-bit codes in whole
// bytes (tests/fixtures/: LeNet-5 LSQ, their index entries say packed_bits 4 and 8) load with the
// codes repacked without gaps, run, and re-save smaller with the same codes and the same outputs.
// tests/reference/quantize_h5py_check.py checks the values against numpy's decoding of the files.
TEST(PackedCheckpointTest, LoadsCodesWrittenInWiderFields) {
  for (const auto& [file, bits] : {std::pair<std::string, int64_t>{"lenet5_lsq_w3_packed4.h5", 3},
                                   std::pair<std::string, int64_t>{"lenet5_lsq_w5_packed8.h5", 5}}) {
    const std::string path = join_path(source_dir(), "tests/fixtures/" + file);
    Checkpoint ck = load_checkpoint(path);
    const int64_t old_width = bits == 3 ? 4 : 8;
    int64_t packed_nodes = 0;
    double saving = 0;  // bytes the dense codes save over the fixture's fields
    for (const auto& n : ck.graph.nodes()) {
      if (!n.buffers.contains("weight_codes")) continue;
      ++packed_nodes;
      int64_t count = 1;
      for (int64_t d : n.attr_ints("weight_shape")) count *= d;
      EXPECT_EQ(n.attr_int("weight_bits"), bits) << file << " " << n.name;
      EXPECT_EQ(n.buffers.at("weight_codes").numel(), q::packed_size(count, bits)) << file << " " << n.name;
      saving += static_cast<double>(q::packed_size(count, old_width) - q::packed_size(count, bits));
    }
    EXPECT_EQ(packed_nodes, 3) << file;  // conv2, fc1, fc2
    GraphModule loaded(ck.graph);
    loaded->eval();
    at::NoGradGuard ng;
    at::Tensor x = at::randn({16, 1, 28, 28});
    at::Tensor expected = loaded->forward(x);
    const std::string again = scratch("resaved_" + file);
    save_checkpoint(again, loaded->graph());
    const double before = tensor_data_bytes(path), after = tensor_data_bytes(again);
    // Tensors start at 8-byte offsets: up to 7 bytes of padding each may come or go.
    EXPECT_NEAR(before - after, saving, 7.0 * static_cast<double>(packed_nodes)) << file << ": " << before << " → " << after;
    Checkpoint ck2 = load_checkpoint(again);
    for (const auto& n : ck.graph.nodes()) {
      if (!n.buffers.contains("weight_codes")) continue;
      EXPECT_TRUE(ck2.graph.node(n.name).buffers.at("weight_codes").equal(n.buffers.at("weight_codes"))) << n.name;
    }
    GraphModule reloaded(ck2.graph);
    reloaded->eval();
    EXPECT_TRUE(reloaded->forward(x).equal(expected)) << file;
  }
}

// Run by tests/reference/quantize_h5py_check.py: writes, for each method, a packed checkpoint
// <method>.h5 and <method>_decoded.h5 holding the decoded weights as plain float32 tensors (the
// weights the model runs with), into $WHITTLE_QUANT_H5PY_DIR.
TEST(PackedCheckpointTest, WriteForPython) {
  const char* dir = std::getenv("WHITTLE_QUANT_H5PY_DIR");
  if (!dir) GTEST_SKIP() << "run by tests/reference/quantize_h5py_check.py";
  struct Case {
    std::string name;
    q::Config cfg;
  };
  std::vector<Case> cases{{"dorefa_w2a2", config("dorefa", 2, 2)}, {"dorefa_w3a3", config("dorefa", 3, 3)},
                          {"dorefa_w4a4", config("dorefa", 4, 4)}, {"dorefa_w8a8", config("dorefa", 8, 8)},
                          {"dorefa_w1a2", config("dorefa", 1, 2)}, {"twn", config("twn")},
                          {"bnn", config("bnn")}, {"xnor", config("xnor")},
                          {"lsq_w3a3", config("lsq", 3, 3)}, {"lsq_w2a2", config("lsq", 2, 2)},
                          {"lsq_w6a6", config("lsq", 6, 6)}};
  auto write_decoded = [&](const Graph& g, const std::string& stem) {
    Graph decoded = g.clone();
    for (auto& n : decoded.nodes()) {
      if (n.weight_transforms.empty()) continue;
      at::NoGradGuard ng;
      at::Tensor w = transformed_weight(g.node(n.name), false).detach().clone();
      n.weight_transforms.clear();
      n.params.set("weight", w);
      n.buffers.erase("weight_codes");  // a loaded checkpoint's packed node
      n.buffers.erase("weight_scale");
    }
    save_checkpoint(join_path(dir, stem + "_decoded.h5"), decoded);
  };
  for (const auto& c : cases) {
    GraphModule m(build_model("resnet20"));
    q::apply(m, c.cfg);
    train_a_little(m, {1, 3, 32, 32}, c.cfg, 1);
    save_checkpoint(join_path(dir, c.name + ".h5"), m->graph());
    write_decoded(m->graph(), c.name);
  }
  // The fixtures of LoadsCodesWrittenInWiderFields, as loaded and written again (the script also
  // decodes the fixture files themselves).
  for (const std::string stem : {"lenet5_lsq_w3_packed4", "lenet5_lsq_w5_packed8"}) {
    Checkpoint ck = load_checkpoint(join_path(source_dir(), "tests/fixtures/" + stem + ".h5"));
    save_checkpoint(join_path(dir, "fixture_" + stem + ".h5"), ck.graph);
    write_decoded(ck.graph, "fixture_" + stem);
  }
}

}  // namespace
}  // namespace whittle::test
