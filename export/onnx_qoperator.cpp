// The QOperator form of an int8 ONNX model (onnx.h, OnnxOptions::qoperator).

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "export/onnx.h"

namespace whittle {
namespace {

using onnx_proto::ElemType;
using onnx_proto::ModelSpec;
using onnx_proto::NodeSpec;
using onnx_proto::TensorSpec;

// The float32 values of a float initializer (raw little-endian, as the writer stores them).
std::vector<float> floats_of(const TensorSpec& t) {
  std::vector<float> v(t.raw.size() / sizeof(float));
  std::memcpy(v.data(), t.raw.data(), v.size() * sizeof(float));
  return v;
}

}  // namespace

int64_t to_qoperator(ModelSpec& m) {
  std::map<std::string, const TensorSpec*> init;
  for (const TensorSpec& t : m.initializers) init[t.name] = &t;
  std::map<std::string, size_t> producer;
  std::map<std::string, std::vector<size_t>> consumers;
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    for (const std::string& o : m.nodes[i].outputs) producer[o] = i;
    for (const std::string& in : m.nodes[i].inputs)
      if (!in.empty()) consumers[in].push_back(i);
  }
  std::set<std::string> graph_outputs;
  for (const auto& v : m.outputs) graph_outputs.insert(v.name);
  auto made_by = [&](const std::string& value, const char* op) -> const NodeSpec* {
    auto p = producer.find(value);
    return p != producer.end() && m.nodes[p->second].op_type == op ? &m.nodes[p->second] : nullptr;
  };
  auto float_init = [&](const std::string& name) -> const TensorSpec* {
    auto it = init.find(name);
    return it != init.end() && it->second->type == ElemType::kFloat ? it->second : nullptr;
  };

  std::set<size_t> removed;
  std::vector<TensorSpec> biases;
  int64_t rewritten = 0;
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    NodeSpec& conv = m.nodes[i];
    if (conv.op_type != "Conv" || conv.inputs.size() < 2) continue;
    // x̂ = DequantizeLinear(x_q, s_x, z_x) with a per-tensor scale; ŵ = DequantizeLinear of int8 codes.
    const NodeSpec* dx = made_by(conv.inputs[0], "DequantizeLinear");
    const NodeSpec* dw = made_by(conv.inputs[1], "DequantizeLinear");
    if (!dx || !dw || dx->inputs.size() != 3 || dw->inputs.size() != 3) continue;
    const TensorSpec* sx = float_init(dx->inputs[1]);
    const TensorSpec* sw = float_init(dw->inputs[1]);
    auto codes = init.find(dw->inputs[0]);
    if (!sx || !sw || codes == init.end() || codes->second->type != ElemType::kInt8 || floats_of(*sx).size() != 1) continue;
    // The output's only reader is a QuantizeLinear, and the output is no graph output.
    const std::string& y = conv.outputs.at(0);
    const std::vector<size_t>& readers = consumers[y];
    if (graph_outputs.count(y) || readers.size() != 1 || m.nodes[readers[0]].op_type != "QuantizeLinear") continue;
    const NodeSpec& qy = m.nodes[readers[0]];
    if (qy.inputs.size() != 3) continue;
    // The bias as int32 on the accumulator's grid s_x·s_w (per output channel), as QLinearConv takes it.
    std::string bias_name;
    if (conv.inputs.size() > 2 && !conv.inputs[2].empty()) {
      const TensorSpec* b = float_init(conv.inputs[2]);
      if (!b) continue;
      const std::vector<float> bv = floats_of(*b), swv = floats_of(*sw);
      const double s_x = floats_of(*sx)[0];
      TensorSpec q;
      q.name = conv.name + "/bias_int32";
      q.type = ElemType::kInt32;
      q.dims = b->dims;
      q.raw.resize(bv.size() * sizeof(int32_t));
      for (size_t c = 0; c < bv.size(); ++c) {
        const double step = s_x * static_cast<double>(swv.size() == 1 ? swv[0] : swv.at(c));
        const int32_t v = static_cast<int32_t>(std::nearbyint(static_cast<double>(bv[c]) / step));
        std::memcpy(q.raw.data() + c * sizeof(int32_t), &v, sizeof(int32_t));
      }
      bias_name = q.name;
      biases.push_back(std::move(q));
    }
    NodeSpec ql;
    ql.op_type = "QLinearConv";
    ql.name = conv.name;
    ql.inputs = {dx->inputs[0], dx->inputs[1], dx->inputs[2], dw->inputs[0], dw->inputs[1], dw->inputs[2],
                 qy.inputs[1],  qy.inputs[2]};
    if (!bias_name.empty()) ql.inputs.push_back(bias_name);
    ql.outputs = qy.outputs;
    ql.attributes = conv.attributes;
    removed.insert(readers[0]);
    conv = std::move(ql);
    ++rewritten;
  }
  // Drop the rewritten QuantizeLinear nodes and the DequantizeLinear nodes nothing reads any more.
  std::vector<NodeSpec> kept;
  for (size_t i = 0; i < m.nodes.size(); ++i)
    if (!removed.count(i)) kept.push_back(std::move(m.nodes[i]));
  for (bool changed = true; changed;) {
    changed = false;
    std::set<std::string> read(graph_outputs);
    for (const NodeSpec& n : kept) read.insert(n.inputs.begin(), n.inputs.end());
    for (size_t i = 0; i < kept.size(); ++i)
      if (kept[i].op_type == "DequantizeLinear" && !read.count(kept[i].outputs.at(0))) {
        kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(i));
        changed = true;
        break;
      }
  }
  m.nodes = std::move(kept);
  for (TensorSpec& b : biases) m.initializers.push_back(std::move(b));
  // Initializers nothing reads any more (the float biases of the rewritten layers).
  std::set<std::string> read;
  for (const NodeSpec& n : m.nodes) read.insert(n.inputs.begin(), n.inputs.end());
  std::vector<TensorSpec> used;
  for (TensorSpec& t : m.initializers)
    if (read.count(t.name)) used.push_back(std::move(t));
  m.initializers = std::move(used);
  return rewritten;
}

}  // namespace whittle
