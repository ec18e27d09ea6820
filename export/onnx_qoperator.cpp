// The QOperator form of an int8 ONNX model (onnx.h, OnnxOptions::qoperator).

#include <algorithm>
#include <cmath>
#include <iterator>
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

const onnx_proto::Attribute* attribute(const NodeSpec& n, const std::string& name) {
  for (const auto& a : n.attributes)
    if (a.name == name) return &a;
  return nullptr;
}

// Moves a DequantizeLinear(x_q, s, z) with a per-tensor scale past the MaxPool (without padding)
// or Flatten reading it: P(DQ(x_q)) = DQ(P(x_q)) exactly (the maximum of a monotone map; a
// reshape), so that the layer after P reads a DequantizeLinear and can become an integer operator.
// The DequantizeLinear stays for its other readers (the cleanup drops it when none is left).
int64_t sink_dequantize(ModelSpec& m, const std::map<std::string, const TensorSpec*>& init) {
  int64_t moved = 0;
  for (bool changed = true; changed;) {
    changed = false;
    std::map<std::string, size_t> producer;
    for (size_t i = 0; i < m.nodes.size(); ++i)
      for (const std::string& o : m.nodes[i].outputs) producer[o] = i;
    for (size_t i = 0; i < m.nodes.size() && !changed; ++i) {
      NodeSpec& p = m.nodes[i];
      if ((p.op_type != "MaxPool" && p.op_type != "Flatten") || p.inputs.empty() || p.outputs.size() != 1) continue;
      if (p.op_type == "MaxPool") {
        const auto* pads = attribute(p, "pads");
        const auto* auto_pad = attribute(p, "auto_pad");
        if ((pads && std::any_of(pads->ints.begin(), pads->ints.end(), [](int64_t v) { return v != 0; })) ||
            (auto_pad && auto_pad->s != "NOTSET" && auto_pad->s != "VALID"))
          continue;
      }
      auto src = producer.find(p.inputs[0]);
      if (src == producer.end() || m.nodes[src->second].op_type != "DequantizeLinear") continue;
      const NodeSpec dq = m.nodes[src->second];
      auto scale = init.find(dq.inputs.size() == 3 ? dq.inputs[1] : std::string());
      if (scale == init.end() || scale->second->raw.size() != sizeof(float)) continue;  // per tensor only
      NodeSpec after;
      after.op_type = "DequantizeLinear";
      after.name = p.name + "/dequantize";
      after.inputs = {p.outputs[0] + "/codes", dq.inputs[1], dq.inputs[2]};
      after.outputs = p.outputs;
      p.inputs[0] = dq.inputs[0];
      p.outputs[0] = after.inputs[0];
      m.nodes.insert(m.nodes.begin() + static_cast<std::ptrdiff_t>(i) + 1, std::move(after));
      ++moved;
      changed = true;
    }
  }
  return moved;
}

TensorSpec int32_initializer(const std::string& name, const std::vector<int32_t>& v) {
  TensorSpec t;
  t.name = name;
  t.type = ElemType::kInt32;
  t.dims = {static_cast<int64_t>(v.size())};
  t.raw.resize(v.size() * sizeof(int32_t));
  std::memcpy(t.raw.data(), v.data(), t.raw.size());
  return t;
}

}  // namespace

int64_t to_qoperator(ModelSpec& m) {
  std::map<std::string, const TensorSpec*> init;
  for (const TensorSpec& t : m.initializers) init[t.name] = &t;
  sink_dequantize(m, init);
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

  // A layer reading x̂ = DequantizeLinear(x_q, s_x, z_x) with a per-tensor scale and
  // ŵ = DequantizeLinear of int8 weight codes.
  struct Dequantized {
    const NodeSpec* dx;
    const NodeSpec* dw;
    const TensorSpec* sx;
    const TensorSpec* sw;
    const TensorSpec* codes;
  };
  auto dequantized_inputs = [&](const NodeSpec& layer) -> std::optional<Dequantized> {
    const NodeSpec* dx = made_by(layer.inputs[0], "DequantizeLinear");
    const NodeSpec* dw = made_by(layer.inputs[1], "DequantizeLinear");
    if (!dx || !dw || dx->inputs.size() != 3 || dw->inputs.size() != 3) return std::nullopt;
    const TensorSpec* sx = float_init(dx->inputs[1]);
    const TensorSpec* sw = float_init(dw->inputs[1]);
    auto codes = init.find(dw->inputs[0]);
    if (!sx || !sw || codes == init.end() || codes->second->type != ElemType::kInt8 || floats_of(*sx).size() != 1)
      return std::nullopt;
    return Dequantized{dx, dw, sx, sw, codes->second};
  };

  std::set<size_t> removed;
  std::vector<TensorSpec> biases;
  std::vector<std::pair<size_t, std::vector<NodeSpec>>> linear_forms;  // node index → its integer nodes
  int64_t rewritten = 0;
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    NodeSpec& conv = m.nodes[i];
    if (conv.op_type == "Gemm" && conv.inputs.size() >= 2) {
      // y = x̂·ŵᵀ + b (transB 1, alpha and beta 1): MatMulInteger(x_q, codesᵀ, z_x, z_w) gives the
      // exact int32 sums, plus the int32 bias on the accumulator's grid s_x·s_w, then Cast and Mul by
      // s_x·s_w per output channel: y in float, for its QuantizeLinear (or the graph's output).
      const auto* trans_b = attribute(conv, "transB");
      const auto* trans_a = attribute(conv, "transA");
      const auto* alpha = attribute(conv, "alpha");
      const auto* beta = attribute(conv, "beta");
      if (!trans_b || trans_b->i != 1 || (trans_a && trans_a->i != 0) || (alpha && alpha->f != 1.0f) ||
          (beta && beta->f != 1.0f))
        continue;
      const std::optional<Dequantized> d = dequantized_inputs(conv);
      if (!d) continue;
      const NodeSpec* dx = d->dx;
      const TensorSpec *sx = d->sx, *sw = d->sw, *codes = d->codes;
      auto zw = init.find(d->dw->inputs[2]);
      if (zw == init.end() || codes->dims.size() != 2) continue;
      const int64_t O = codes->dims[0], C = codes->dims[1];
      const std::vector<float> swv = floats_of(*sw);
      if (swv.size() != 1 && static_cast<int64_t>(swv.size()) != O) continue;
      const double s_x = floats_of(*sx)[0];
      const TensorSpec* b = conv.inputs.size() > 2 && !conv.inputs[2].empty() ? float_init(conv.inputs[2]) : nullptr;
      if (conv.inputs.size() > 2 && !conv.inputs[2].empty() && !b) continue;
      // codesᵀ [C, O] and the weights' zero points per output column.
      TensorSpec wt;
      wt.name = conv.name + "/weight_codes_t";
      wt.type = ElemType::kInt8;
      wt.dims = {C, O};
      wt.raw.resize(static_cast<size_t>(C * O));
      for (int64_t o = 0; o < O; ++o)
        for (int64_t c = 0; c < C; ++c) wt.raw[c * O + o] = codes->raw[o * C + c];
      TensorSpec zp = *zw->second;
      zp.name = conv.name + "/weight_zero_point";
      if (zp.raw.size() == 1) {  // per tensor: the same for every column
        zp.raw.assign(static_cast<size_t>(O), zp.raw[0]);
        zp.dims = {O};
      }
      TensorSpec step;  // s_x·s_w per output channel
      step.name = conv.name + "/accumulator_scale";
      step.type = ElemType::kFloat;
      step.dims = {O};
      step.raw.resize(static_cast<size_t>(O) * sizeof(float));
      std::vector<int32_t> bias(static_cast<size_t>(O), 0);
      const std::vector<float> bv = b ? floats_of(*b) : std::vector<float>();
      for (int64_t o = 0; o < O; ++o) {
        const double a = s_x * static_cast<double>(swv.size() == 1 ? swv[0] : swv[o]);
        const float af = static_cast<float>(a);
        std::memcpy(step.raw.data() + o * sizeof(float), &af, sizeof(float));
        if (b) bias[o] = static_cast<int32_t>(std::nearbyint(static_cast<double>(bv.at(o)) / a));
      }
      std::vector<NodeSpec> nodes(4);
      const std::string acc = conv.name + "/accumulator", with_bias = conv.name + "/accumulator_biased",
                        as_float = conv.name + "/accumulator_float";
      nodes[0].op_type = "MatMulInteger";
      nodes[0].name = conv.name;
      nodes[0].inputs = {dx->inputs[0], wt.name, dx->inputs[2], zp.name};
      nodes[0].outputs = {acc};
      nodes[1].op_type = "Add";
      nodes[1].name = conv.name + "/bias";
      nodes[1].inputs = {acc, conv.name + "/bias_int32"};
      nodes[1].outputs = {with_bias};
      nodes[2].op_type = "Cast";
      nodes[2].name = conv.name + "/to_float";
      nodes[2].inputs = {b ? with_bias : acc};
      nodes[2].outputs = {as_float};
      nodes[2].attributes = {onnx_proto::Attribute::of("to", static_cast<int64_t>(ElemType::kFloat))};
      nodes[3].op_type = "Mul";
      nodes[3].name = conv.name + "/scale";
      nodes[3].inputs = {as_float, step.name};
      nodes[3].outputs = conv.outputs;
      if (b) {
        biases.push_back(int32_initializer(conv.name + "/bias_int32", bias));
      } else {
        nodes.erase(nodes.begin() + 1);
      }
      biases.push_back(std::move(wt));
      biases.push_back(std::move(zp));
      biases.push_back(std::move(step));
      linear_forms.emplace_back(i, std::move(nodes));
      ++rewritten;
      continue;
    }
    if (conv.op_type != "Conv" || conv.inputs.size() < 2) continue;
    const std::optional<Dequantized> d = dequantized_inputs(conv);
    if (!d) continue;
    const NodeSpec *dx = d->dx, *dw = d->dw;
    const TensorSpec *sx = d->sx, *sw = d->sw;
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
  // Drop the rewritten QuantizeLinear nodes and the DequantizeLinear nodes nothing reads any more;
  // a rewritten linear layer's Gemm gives way to its integer nodes.
  std::map<size_t, std::vector<NodeSpec>> replaced(std::make_move_iterator(linear_forms.begin()),
                                                   std::make_move_iterator(linear_forms.end()));
  std::vector<NodeSpec> kept;
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    if (removed.count(i)) continue;
    if (auto r = replaced.find(i); r != replaced.end()) {
      for (NodeSpec& n : r->second) kept.push_back(std::move(n));
      continue;
    }
    kept.push_back(std::move(m.nodes[i]));
  }
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
