#include "export/writers.h"

#include <mutex>

#include "core/error.h"
#include "core/registration.h"
#include "fuse/fuse.h"
#include "quantize/quantize.h"

namespace whittle {

Registry<OnnxWriteFn>& onnx_forms() {
  static Registry<OnnxWriteFn> r("ONNX form", "onnx-forms", [](const OnnxWriteFn&) { return std::string("ONNX form"); },
                                 ErrorKind::kRuntime);
  return r;
}

Registry<TorchScriptWriteFn>& torchscript_forms() {
  static Registry<TorchScriptWriteFn> r("TorchScript form", "torchscript-forms",
                                        [](const TorchScriptWriteFn&) { return std::string("TorchScript form"); },
                                        ErrorKind::kRuntime);
  return r;
}

void register_export_writers() {
  // Pending registrations first (this one among them when called before any registry lookup): a
  // lookup inside the once-block must not start them, or it would re-enter this function.
  ensure_registered();
  static std::once_flag once;
  std::call_once(once, [] {
    quantize::register_all();
    fuse::register_all();
    detail::attach_onnx_writers();
    detail::attach_torchscript_writers();
    register_onnx_exporter();
    register_torchscript_exporter();
  });
}

void require_forms(const Graph& graph, const std::string& format, const RegistryBase& forms) {
  std::string missing;
  for (const Node& n : graph.nodes())
    if (!forms.contains(n.op)) missing += (missing.empty() ? "" : ", ") + ("'" + n.name + "' (" + n.op + ")");
  if (missing.empty()) return;
  std::string with;
  for (const std::string& k : registered_ops())
    if (forms.contains(k)) with += (with.empty() ? "" : ", ") + k;
  throw Error(format + " export: no " + format + " form for node " + missing + "; ops with one: " + with);
}

// The module's registration (WHITTLE_REGISTER_MODULE) is in exporter.cpp.

}  // namespace whittle
