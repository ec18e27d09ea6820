#pragma once
// The export module's registration: attaches the ONNX and TorchScript writer hooks
// (OpTraits::to_onnx, OpTraits::to_torchscript) of the built-in, quantize and fuse ops.

#include <functional>
#include <string>

#include "graph/graph.h"
#include "graph/op_registry.h"

namespace whittle {

/// Attaches the writer hooks to the op registry once (idempotent, thread-safe; registers quantize's
/// and fuse's ops first). export_onnx and export_torchscript call it; it also runs at registration
/// (core/registration.h) in every program that links the export module.
void register_export_writers();

/// Throws whittle::Error "<format> export: no <format> form for node 'a' (op), ...; ops with one:
/// ..." when the op of some node of `graph` lacks the writer hook `has` tests for; every such node
/// is named, before any file is touched.
void require_writers(const Graph& graph, const std::string& format, const std::function<bool(const OpTraits&)>& has);

namespace detail {
void attach_onnx_writers();         // onnx_ops.cpp
void attach_torchscript_writers();  // torchscript_ops.cpp
}  // namespace detail

}  // namespace whittle
