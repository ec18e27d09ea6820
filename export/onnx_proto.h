#pragma once
// A plain description of an ONNX model (no LibTorch, no protobuf types), turned into an ONNX
// ModelProto by ONNX's own C++ library, checked by its checker and strict shape inference, and
// serialized. The translation unit that implements it is compiled without LibTorch's include
// directories: LibTorch ships protobuf 3.13 headers, ONNX's library is built against the system
// protobuf, and one unit cannot include both (docs/export.md, "Build notes").
//
// Spec: https://github.com/onnx/onnx/blob/main/docs/IR.md (ModelProto, GraphProto, NodeProto,
// TensorProto with raw_data in little-endian order, ValueInfoProto with symbolic dims).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace whittle::onnx_proto {

/// TensorProto.DataType values used by the writer.
enum class ElemType : int32_t { kFloat = 1, kUint8 = 2, kInt8 = 3, kInt32 = 6, kInt64 = 7, kBool = 9 };

/// One node attribute; `kind` says which field holds the value.
struct Attribute {
  enum class Kind { kInt, kFloat, kString, kInts, kFloats } kind = Kind::kInt;
  std::string name;
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;

  static Attribute of(std::string name, int64_t v);
  static Attribute of(std::string name, float v);
  static Attribute of(std::string name, std::string v);
  static Attribute of(std::string name, std::vector<int64_t> v);
  static Attribute of(std::string name, std::vector<float> v);
};

/// One NodeProto (domain "": the default ONNX operator set). An empty input name is an omitted
/// optional input.
struct NodeSpec {
  std::string op_type;
  std::string name;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<Attribute> attributes;
};

/// One initializer: dims outermost first, `raw` holding the elements in little-endian order.
struct TensorSpec {
  std::string name;
  ElemType type = ElemType::kFloat;
  std::vector<int64_t> dims;
  std::string raw;
};

/// A graph input or output: element type and shape; a dim < 0 is symbolic, named `dim_param`.
struct ValueSpec {
  std::string name;
  ElemType type = ElemType::kFloat;
  std::vector<int64_t> dims;
  std::string dim_param = "N";
};

/// The model: opset of the default domain, graph, producer and metadata.
struct ModelSpec {
  int64_t opset = 17;
  int64_t ir_version = 8;
  std::string producer_name;
  std::string producer_version;
  std::string graph_name;
  std::string doc_string;
  std::map<std::string, std::string> metadata;
  std::vector<NodeSpec> nodes;
  std::vector<TensorSpec> initializers;
  std::vector<ValueSpec> inputs;
  std::vector<ValueSpec> outputs;
};

/// The newest default-domain opset the linked ONNX library knows (17 for ONNX 1.12).
int64_t max_supported_opset();

/// Builds the ModelProto of `model`, runs onnx::checker::check_model and strict shape inference
/// with type checks (which also records the intermediate value shapes), and returns the
/// serialized bytes. Throws std::runtime_error with the checker's message (naming the node) when
/// the model is not valid ONNX.
std::string serialize_checked(const ModelSpec& model);

/// Parses serialized ONNX bytes and runs the checker on them (a round trip of what was written).
/// Returns the number of nodes in the graph. Throws std::runtime_error when the bytes do not parse
/// or do not pass the checker.
int64_t check_serialized(const std::string& bytes);

}  // namespace whittle::onnx_proto
