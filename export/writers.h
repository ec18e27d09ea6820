#pragma once
// The export module's registration: the exporters (exporter.h) and the per-op forms the ONNX and
// TorchScript exporters write with, one registry each (op kind → writer), filled for the built-in,
// quantize and fuse ops by onnx_ops.cpp and torchscript_ops.cpp.

#include <functional>
#include <string>

#include "core/registry.h"
#include "graph/graph.h"
#include "graph/op_registry.h"

namespace whittle {

class OnnxEmitter;         // export/onnx.h
class TorchScriptEmitter;  // export/torchscript_export.h

/// Writes one node through an ONNX emitter (the emitter names the node's input and output
/// values and collects ONNX nodes and initializers). Throws whittle::Error naming the node and
/// attribute when the node has no ONNX form at the emitter's opset.
using OnnxWriteFn = std::function<void(const Node& node, OnnxEmitter& emitter)>;
/// Writes one node as TorchScript through an emitter (which holds the module's tensors and the
/// statements of its forward). Throws like OnnxWriteFn.
using TorchScriptWriteFn = std::function<void(const Node& node, TorchScriptEmitter& emitter)>;

/// The ONNX exporter's per-op forms ("onnx-forms" in `whittle inspect`), by op kind.
Registry<OnnxWriteFn>& onnx_forms();
/// The TorchScript exporter's per-op forms ("torchscript-forms"), by op kind.
Registry<TorchScriptWriteFn>& torchscript_forms();

/// Registers the exporters and fills the per-op form registries once (idempotent, thread-safe;
/// registers quantize's and fuse's ops first). export_onnx and export_torchscript call it; it also
/// runs at registration (core/registration.h) in every program that links the export module.
void register_export_writers();

/// Throws whittle::Error "<format> export: no <format> form for node 'a' (op), ...; ops with one:
/// ..." when the op of some node of `graph` has no entry in `forms`; every such node is named,
/// before any file is touched.
void require_forms(const Graph& graph, const std::string& format, const RegistryBase& forms);

namespace detail {
void attach_onnx_writers();         // onnx_ops.cpp
void attach_torchscript_writers();  // torchscript_ops.cpp
}  // namespace detail

void register_onnx_exporter();         // onnx_exporter.cpp
void register_torchscript_exporter();  // torchscript_exporter.cpp

}  // namespace whittle
