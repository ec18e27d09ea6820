#include "export/onnx.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <stdexcept>

#include "core/error.h"
#include "core/file_util.h"
#include "core/registration.h"
#include "export/deploy.h"
#include "export/writers.h"
#include "graph/op_registry.h"
#include "graph/version.h"
#include "quantize/method.h"
#include "quantize/quantize.h"

namespace whittle {

namespace {

constexpr int64_t kMinOpset = 13;

onnx_proto::ElemType elem_type(at::ScalarType t) {
  switch (t) {
    case at::kLong: return onnx_proto::ElemType::kInt64;
    case at::kInt: return onnx_proto::ElemType::kInt32;
    case at::kByte: return onnx_proto::ElemType::kUint8;
    case at::kChar: return onnx_proto::ElemType::kInt8;
    case at::kBool: return onnx_proto::ElemType::kBool;
    default: return onnx_proto::ElemType::kFloat;
  }
}

onnx_proto::TensorSpec tensor_spec(const std::string& name, const at::Tensor& t_in) {
  at::Tensor t = t_in.detach().to(at::kCPU);
  if (at::isFloatingType(t.scalar_type())) t = t.to(at::kFloat);
  t = t.contiguous();
  onnx_proto::TensorSpec s;
  s.name = name;
  s.type = elem_type(t.scalar_type());
  s.dims = t.sizes().vec();
  s.raw.assign(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.nbytes()));
  return s;
}

}  // namespace

OnnxEmitter::OnnxEmitter(const Graph& graph, int64_t opset) : graph_(graph), opset_(opset) {
  for (const std::string& v : graph.inputs()) used_[v] = 1;
  for (const Node& n : graph.nodes())
    for (const std::string& v : n.outputs) used_[v] = 1;
}

const Shape& OnnxEmitter::shape(const std::string& value) const { return graph_.value(value).shape; }

void OnnxEmitter::node(const Node& n, const std::string& op_type, std::vector<std::string> inputs,
                       std::vector<std::string> outputs, std::vector<Attribute> attributes, const std::string& part) {
  onnx_proto::NodeSpec s;
  s.op_type = op_type;
  s.name = part.empty() ? n.name : n.name + "/" + part;
  s.inputs = std::move(inputs);
  s.outputs = std::move(outputs);
  s.attributes = std::move(attributes);
  model_.nodes.push_back(std::move(s));
}

std::string OnnxEmitter::temp(const Node& n, const std::string& hint) {
  std::string base = n.name + "/" + hint;
  std::string name = base;
  for (int k = 1; used_.count(name); ++k) name = base + "_" + std::to_string(k);
  used_[name] = 1;
  return name;
}

std::string OnnxEmitter::initializer(const Node& n, const std::string& name, const at::Tensor& t) {
  std::string base = n.name + "." + name;
  std::string unique = base;
  for (int k = 1; used_.count(unique); ++k) unique = base + "_" + std::to_string(k);
  used_[unique] = 1;
  model_.initializers.push_back(tensor_spec(unique, t));
  return unique;
}

std::string OnnxEmitter::ints(const Node& n, const std::string& name, const std::vector<int64_t>& values) {
  return initializer(n, name, at::tensor(values, at::kLong));
}

std::string OnnxEmitter::scalar(const Node& n, const std::string& name, float value) {
  return initializer(n, name, at::scalar_tensor(value, at::kFloat));
}

std::string OnnxEmitter::tensor(const Node& n, const std::string& name) {
  const at::Tensor* t = n.params.find(name);
  if (!t) t = n.buffers.find(name);
  if (!t || !t->defined()) return "";
  return initializer(n, name, *t);
}

std::string OnnxEmitter::weight(const Node& n, int64_t axis) {
  at::Tensor w;
  {
    at::NoGradGuard no_grad;
    w = transformed_weight(n, /*training=*/false).detach();
  }
  // A weight on an int8 grid (its quantizer's integer_grid: weight = scale[c]·q) is stored as its
  // integer codes q, an int8 initializer, feeding DequantizeLinear per channel on the
  // output-channel axis: no float copy of it in the file (the QDQ form ONNX Runtime and TensorRT
  // run on integer kernels).
  const std::optional<quantize::IntegerGrid> grid = quantize::integer_grid(n);
  const bool int8_grid = grid && grid->axis == axis && axis < w.dim() && grid->scale.numel() == w.size(axis);
  if (!int8_grid) return initializer(n, "weight", w);
  std::vector<int64_t> view(static_cast<size_t>(w.dim()), 1);
  view[static_cast<size_t>(axis)] = w.size(axis);
  const at::Tensor q = at::round(w.to(at::kFloat) / grid->scale.to(at::kFloat).reshape(view));
  if (q.numel() > 0 && (!at::isfinite(q).all().item<bool>() || q.min().item<float>() < -128.0f ||
                        q.max().item<float>() > 127.0f))
    throw Error("node '" + n.name + "' (" + n.op + "): weight codes outside int8 for its integer grid (writer bug)");
  const std::string codes = initializer(n, "weight_quantized", q.to(at::kChar));
  const std::string s = initializer(n, "weight_scale", grid->scale);
  const std::string zp = initializer(n, "weight_zero_point", at::zeros({w.size(axis)}, at::kChar));
  const std::string dq = temp(n, "weight_dequantized");
  node(n, "DequantizeLinear", {codes, s, zp}, {dq}, {Attribute::of("axis", axis)}, "weight_dequantize");
  return dq;
}

void OnnxEmitter::sign_plus_one(const Node& n, const std::string& x, const std::string& out, const std::string& part) {
  const std::string p = part.empty() ? "sign" : part;
  const std::string s1 = temp(n, p + "_raw");
  const std::string scaled = temp(n, p + "_scaled");
  const std::string shifted = temp(n, p + "_shifted");
  node(n, "Sign", {x}, {s1}, {}, p + "_raw");
  node(n, "Mul", {s1, scalar(n, p + "_two", 2.0f)}, {scaled}, {}, p + "_scale");
  node(n, "Add", {scaled, scalar(n, p + "_one", 1.0f)}, {shifted}, {}, p + "_shift");
  node(n, "Sign", {shifted}, {out}, {}, part);
}

void OnnxEmitter::unsupported(const Node& n, const std::string& what) const {
  throw Error("node '" + n.name + "' (" + n.op + "): no ONNX form for " + what + " at opset " + std::to_string(opset_));
}

std::string onnx_model_bytes(const Graph& graph_in, const OnnxOptions& options) {
  register_export_writers();
  const int64_t max_opset = onnx_proto::max_supported_opset();
  if (options.opset < kMinOpset || options.opset > max_opset)
    throw Error("ONNX export: opset " + std::to_string(options.opset) + " is not supported (" + std::to_string(kMinOpset) +
                    ".." + std::to_string(max_opset) + ")",
                ErrorKind::kUsage);
  const Graph graph = deploy_graph(graph_in);
  require_forms(graph, "ONNX", onnx_forms());
  OnnxEmitter e(graph, options.opset);
  for (const Node& n : graph.nodes()) onnx_forms().get(n.op)(n, e);

  onnx_proto::ModelSpec& m = e.model();
  m.opset = options.opset;
  m.producer_name = "whittle";
  m.producer_version = options.producer_version.empty() ? version() : options.producer_version;
  m.graph_name = "whittle";
  m.metadata = options.metadata;
  auto value_spec = [&](const std::string& name) {
    onnx_proto::ValueSpec v;
    v.name = name;
    v.dims = graph.value(name).shape;
    if (options.dynamic_batch && !v.dims.empty()) v.dims[0] = -1;
    return v;
  };
  for (const std::string& v : graph.inputs()) m.inputs.push_back(value_spec(v));
  for (const std::string& v : graph.outputs()) {
    if (graph.value(v).producer.empty())
      throw Error("ONNX export: graph output '" + v + "' is a graph input; ONNX needs a node between them");
    m.outputs.push_back(value_spec(v));
  }
  if (options.qoperator) to_qoperator(m);
  try {
    return onnx_proto::serialize_checked(m);
  } catch (const std::runtime_error& ex) {
    throw Error(std::string("ONNX export: ") + ex.what());
  }
}

void export_onnx(const Graph& graph, const std::string& path, const OnnxOptions& options) {
  const std::string bytes = onnx_model_bytes(graph, options);
  write_file_atomic(path, bytes);
}

int64_t check_onnx_file(const std::string& path) {
  if (!is_regular_file(path)) throw Error(path + ": no such file");
  const std::string bytes = read_file(path);
  try {
    return onnx_proto::check_serialized(bytes);
  } catch (const std::runtime_error& ex) {
    throw Error(path + ": " + ex.what());
  }
}

}  // namespace whittle
