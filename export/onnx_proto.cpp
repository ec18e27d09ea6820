// The ONNX model builder over ONNX's own library (see onnx_proto.h). This unit must not include
// any LibTorch header: it compiles against the system protobuf that libonnx was built with.

#include "onnx_proto.h"

#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <stdexcept>
#include <utility>

namespace whittle::onnx_proto {

Attribute Attribute::of(std::string name, int64_t v) {
  Attribute a;
  a.kind = Kind::kInt;
  a.name = std::move(name);
  a.i = v;
  return a;
}
Attribute Attribute::of(std::string name, float v) {
  Attribute a;
  a.kind = Kind::kFloat;
  a.name = std::move(name);
  a.f = v;
  return a;
}
Attribute Attribute::of(std::string name, std::string v) {
  Attribute a;
  a.kind = Kind::kString;
  a.name = std::move(name);
  a.s = std::move(v);
  return a;
}
Attribute Attribute::of(std::string name, std::vector<int64_t> v) {
  Attribute a;
  a.kind = Kind::kInts;
  a.name = std::move(name);
  a.ints = std::move(v);
  return a;
}
Attribute Attribute::of(std::string name, std::vector<float> v) {
  Attribute a;
  a.kind = Kind::kFloats;
  a.name = std::move(name);
  a.floats = std::move(v);
  return a;
}

namespace {

void set_value(onnx::ValueInfoProto* v, const ValueSpec& spec) {
  v->set_name(spec.name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(spec.type));
  auto* shape = tt->mutable_shape();
  for (int64_t d : spec.dims) {
    auto* dim = shape->add_dim();
    if (d < 0) dim->set_dim_param(spec.dim_param);
    else dim->set_dim_value(d);
  }
}

void set_attribute(onnx::AttributeProto* a, const Attribute& spec) {
  a->set_name(spec.name);
  switch (spec.kind) {
    case Attribute::Kind::kInt:
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(spec.i);
      break;
    case Attribute::Kind::kFloat:
      a->set_type(onnx::AttributeProto::FLOAT);
      a->set_f(spec.f);
      break;
    case Attribute::Kind::kString:
      a->set_type(onnx::AttributeProto::STRING);
      a->set_s(spec.s);
      break;
    case Attribute::Kind::kInts:
      a->set_type(onnx::AttributeProto::INTS);
      for (int64_t v : spec.ints) a->add_ints(v);
      break;
    case Attribute::Kind::kFloats:
      a->set_type(onnx::AttributeProto::FLOATS);
      for (float v : spec.floats) a->add_floats(v);
      break;
  }
}

onnx::ModelProto build(const ModelSpec& spec) {
  onnx::ModelProto m;
  m.set_ir_version(spec.ir_version);
  m.set_producer_name(spec.producer_name);
  m.set_producer_version(spec.producer_version);
  if (!spec.doc_string.empty()) m.set_doc_string(spec.doc_string);
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(spec.opset);
  for (const auto& [key, value] : spec.metadata) {
    auto* p = m.add_metadata_props();
    p->set_key(key);
    p->set_value(value);
  }
  auto* g = m.mutable_graph();
  g->set_name(spec.graph_name);
  for (const ValueSpec& v : spec.inputs) set_value(g->add_input(), v);
  for (const ValueSpec& v : spec.outputs) set_value(g->add_output(), v);
  for (const TensorSpec& t : spec.initializers) {
    auto* init = g->add_initializer();
    init->set_name(t.name);
    init->set_data_type(static_cast<int32_t>(t.type));
    for (int64_t d : t.dims) init->add_dims(d);
    init->set_raw_data(t.raw);
  }
  for (const NodeSpec& n : spec.nodes) {
    auto* node = g->add_node();
    node->set_op_type(n.op_type);
    node->set_name(n.name);
    for (const auto& i : n.inputs) node->add_input(i);
    for (const auto& o : n.outputs) node->add_output(o);
    for (const Attribute& a : n.attributes) set_attribute(node->add_attribute(), a);
  }
  return m;
}

}  // namespace

int64_t max_supported_opset() {
  return onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map().at(onnx::ONNX_DOMAIN).second;
}

std::string serialize_checked(const ModelSpec& spec) {
  onnx::ModelProto m = build(spec);
  try {
    onnx::checker::check_model(m);
    onnx::ShapeInferenceOptions options(/*check_type=*/true, /*strict_mode=*/1, /*data_prop=*/false);
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), options);
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("the ONNX checker rejects the model: ") + e.what());
  }
  std::string bytes;
  if (!m.SerializeToString(&bytes)) throw std::runtime_error("protobuf could not serialize the ONNX model");
  return bytes;
}

int64_t check_serialized(const std::string& bytes) {
  onnx::ModelProto m;
  if (!m.ParseFromString(bytes)) throw std::runtime_error("not an ONNX model (protobuf parse failed)");
  try {
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("the ONNX checker rejects the model: ") + e.what());
  }
  return m.graph().node_size();
}

}  // namespace whittle::onnx_proto
