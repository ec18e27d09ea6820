// The ONNX exporter entry: `whittle export --format onnx`, the recipe's outputs.export: [onnx]
// (onnx.h has the forms; ONNX operators spec, opsets 13..17).

#include "core/error.h"
#include "export/exporter.h"
#include "export/onnx.h"

namespace whittle {

namespace {

// The options of an ONNX export (keys: `whittle export --opset --static-batch`, the recipe's
// outputs.onnx_opset and outputs.onnx_static_batch).
struct OnnxExportOptions {
  int64_t opset = 17;         ///< default-domain opset
  bool static_batch = false;  ///< fix the batch dimension to the model's declared one (default: dynamic "N")
  bool qoperator = false;     ///< int8 layers as QLinearConv and MatMulInteger (onnx.h, to_qoperator)
};

const OptionsSchema<OnnxExportOptions>& onnx_schema() {
  using O = OnnxExportOptions;
  static const OptionsSchema<O> schema =
      OptionsSchema<O>()
          .add("opset", &O::opset, "ONNX opset of the export")
          .in_range(Range::closed(13, 17))
          .add("static_batch", &O::static_batch, "fix the batch dimension to the model's declared one (else a dynamic 'N')")
          .add("qoperator", &O::qoperator,
               "the QOperator form: int8 convolutions as QLinearConv and linear layers as MatMulInteger, with "
               "int32 biases (else the QuantizeLinear/DequantizeLinear form)");
  return schema;
}

OnnxOptions onnx_options(const Settings& settings, const ExportInfo* info) {
  const OnnxExportOptions o = onnx_schema().parse(settings, "export to onnx");
  OnnxOptions out;
  out.opset = o.opset;
  out.dynamic_batch = !o.static_batch;
  out.qoperator = o.qoperator;
  if (info) out.metadata = info->metadata;
  return out;
}

class OnnxExporter final : public Exporter {
 public:
  std::string name() const override { return "onnx"; }
  std::string description() const override {
    return "ONNX (opsets 13..17), checked by the ONNX checker; quantized activations and int8 weight grids as "
           "QuantizeLinear/DequantizeLinear";
  }
  std::vector<std::string> extensions() const override { return {".onnx"}; }
  std::vector<KeySpec> option_keys() const override { return onnx_schema().keys(); }
  void check(const Graph& graph, const Settings& options) const override { onnx_model_bytes(graph, onnx_options(options, nullptr)); }
  void write(const Graph& graph, const std::string& path, const Settings& options, const ExportInfo& info) const override {
    export_onnx(graph, path, onnx_options(options, &info));
  }
  int64_t check_batch(const Graph& graph, const Settings& options) const override {
    if (onnx_options(options, nullptr).dynamic_batch || graph.inputs().empty()) return 4;
    return graph.value(graph.inputs()[0]).shape.at(0);
  }
  std::string summary(const Settings& options) const override {
    return "ONNX, opset " + std::to_string(onnx_options(options, nullptr).opset);
  }
  std::string verify(const std::string& path, const CheckData*) const override {
    const int64_t nodes = check_onnx_file(path);
    return path + " parses and passes the ONNX checker (" + std::to_string(nodes) +
           " nodes); compare its outputs with onnxruntime (docs/export.md)";
  }
};

}  // namespace

void register_onnx_exporter() { register_exporter(std::make_unique<OnnxExporter>()); }

}  // namespace whittle
