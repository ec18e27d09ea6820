#pragma once
// ONNX export: a whittle graph (float, quantized, pruned, fused, imported) written as an ONNX
// model that onnxruntime runs and the ONNX checker accepts. The writer walks the graph in order
// and calls each node's OpTraits::to_onnx hook (op_registry.h) with an OnnxEmitter; the hooks of
// the built-in, quantize and fuse ops are attached by this module (onnx_ops.cpp). An op without a
// hook, or an attribute a hook cannot express, is a whittle::Error naming the node; no file is
// written then.
//
// Forms (docs/export.md has the op table and the exactness of each form):
//   - the graph is first put in deploy form (deploy.h): QAT conv_bn_qat nodes become their base
//     layer with the folded weight and bias; every weight is the one eval() runs with;
//   - quantized weights (LSQ, int8, DoReFa 1..7 bits, TWN, BNN, XNOR) as int8 initializers of
//     their codes into DequantizeLinear with the scales per output channel (axis 0; 1 for a
//     transposed conv), no float copy; 8-bit DoReFa weights (codes beyond int8) as float constants;
//   - DoReFa activations of k ≤ 8 bits as Clip(0, c) (k < 8) → QuantizeLinear → DequantizeLinear,
//     uint8 with zero point 0 and scale c/(2^k − 1), per tensor; int8 activations as
//     QuantizeLinear → DequantizeLinear with their scale and uint8 or int8 zero point, the pattern
//     integer runtimes fuse into QLinearConv and QLinearAdd;
//   - sign binarizers (BNN activations, threshold_sign) as Sign(2·Sign(x) + 1), so sign(0) = +1,
//     after a Sub of the learned threshold for RSign;
//   - batch_norm as BatchNormalization in inference form with the running statistics.
// Spec: ONNX operators, https://github.com/onnx/onnx/blob/main/docs/Operators.md (opsets 13..17).

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "export/onnx_proto.h"
#include "graph/graph.h"

namespace whittle {

/// Options of export_onnx.
struct OnnxOptions {
  int64_t opset = 17;          ///< default-domain opset, 13..17 (the linked ONNX library's newest)
  bool dynamic_batch = true;   ///< input and output dim 0 symbolic ("N"); false: the graph's batch size
  std::string producer_version;  ///< written as producer_version (default: whittle's version)
  std::map<std::string, std::string> metadata;  ///< extra metadata_props (key → value)
  /// The QOperator form (to_qoperator): convolutions between int8 quantizers as QLinearConv.
  bool qoperator = false;
};

/// Rewrites the int8 Q/DQ pattern of `model` into ONNX's QOperator form (QLinearConv,
/// MatMulInteger; ONNX operators spec). A DequantizeLinear with a per-tensor scale first moves past
/// the MaxPool (without padding) or Flatten reading it (exact). Each Conv reading
/// DequantizeLinear(x_q, s_x, z_x) with a per-tensor scale and DequantizeLinear of int8 weight
/// codes, whose output only a QuantizeLinear reads, becomes one QLinearConv(x_q, s_x, z_x, codes,
/// s_w, z_w, s_y, z_y, bias) writing that QuantizeLinear's output, the float bias as int32
/// round(b/(s_x·s_w)) per output channel. Each Gemm (transB 1) reading such DequantizeLinear
/// nodes becomes MatMulInteger(x_q, codesᵀ, z_x, z_w) + that int32 bias, Cast to float and Mul by
/// s_x·s_w per output channel (its float output kept, for its QuantizeLinear or the graph's
/// output). DequantizeLinear nodes and initializers left unread are dropped. Additions keep the
/// Q/DQ form (the default domain has no integer Add). Returns the layers rewritten.
int64_t to_qoperator(onnx_proto::ModelSpec& model);

/// The ONNX bytes of `graph` (deploy form, checked by onnx::checker and strict shape inference).
/// Throws whittle::Error naming the node for an op or attribute without an ONNX form at
/// `options.opset`, and for an opset outside 13..17.
std::string onnx_model_bytes(const Graph& graph, const OnnxOptions& options = {});

/// Writes onnx_model_bytes(graph, options) to `path` atomically (a temporary file renamed over
/// `path` when complete; nothing is left on error). Throws whittle::Error as onnx_model_bytes,
/// or naming the path when it cannot be written.
void export_onnx(const Graph& graph, const std::string& path, const OnnxOptions& options = {});

/// Parses an ONNX file and runs the ONNX checker on it; returns its node count. Throws
/// whittle::Error naming the path when it does not parse or does not pass.
int64_t check_onnx_file(const std::string& path);

/// What a to_onnx hook writes through (op_registry.h OnnxWriteFn). Value names are whittle's value
/// names (a node's outputs, the graph inputs); ONNX node names are whittle node names, and the
/// extra nodes and values of one whittle node are named "<node>/<part>"; initializers are
/// "<node>.<tensor>" as in a state_dict.
class OnnxEmitter {
 public:
  using Attribute = onnx_proto::Attribute;

  OnnxEmitter(const Graph& graph, int64_t opset);

  /// The default-domain opset being written.
  int64_t opset() const { return opset_; }
  /// The static shape of a value (batch dimension as declared by the graph).
  const Shape& shape(const std::string& value) const;
  /// Appends an ONNX node for whittle node `n`, named n.name, or "n.name/part" when `part` is given.
  void node(const Node& n, const std::string& op_type, std::vector<std::string> inputs, std::vector<std::string> outputs,
            std::vector<Attribute> attributes = {}, const std::string& part = "");
  /// A fresh intermediate value name "<node>/<hint>" (unique in the model).
  std::string temp(const Node& n, const std::string& hint);
  /// Adds initializer "<node>.<name>" holding `t` (float types as float32; int64, int32, uint8,
  /// int8 and bool kept), returns its name.
  std::string initializer(const Node& n, const std::string& name, const at::Tensor& t);
  /// A 1-D int64 initializer "<node>.<name>" (shapes, axes, split sizes), returns its name.
  std::string ints(const Node& n, const std::string& name, const std::vector<int64_t>& values);
  /// A float32 scalar initializer "<node>.<name>", returns its name.
  std::string scalar(const Node& n, const std::string& name, float value);
  /// The node's parameter or buffer `name` as an initializer; "" when the node lacks it.
  std::string tensor(const Node& n, const std::string& name);
  /// The weight the node runs with in eval (its transform stack applied, packed codes decoded),
  /// `axis` its output-channel axis: a float initializer, through QuantizeLinear → DequantizeLinear
  /// (int8, per channel on `axis`) when it is a DoReFa grid of 2..7 bits. Returns the value name.
  std::string weight(const Node& n, int64_t axis);
  /// Writes Sign(2·Sign(x) + 1) into `out`: +1 for x ≥ 0 (including −0), −1 for x < 0.
  void sign_plus_one(const Node& n, const std::string& x, const std::string& out, const std::string& part);
  /// Throws whittle::Error "node 'n' (op): no ONNX form for <what> at opset N".
  [[noreturn]] void unsupported(const Node& n, const std::string& what) const;

  /// The collected model (the driver adds inputs, outputs and metadata).
  onnx_proto::ModelSpec& model() { return model_; }

 private:
  const Graph& graph_;
  int64_t opset_;
  onnx_proto::ModelSpec model_;
  std::map<std::string, int> used_;  ///< names of values and initializers given out so far
};

}  // namespace whittle
