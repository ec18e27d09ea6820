#include "export/writers.h"

#include <mutex>

#include "core/error.h"
#include "core/registration.h"
#include "fuse/fuse.h"
#include "quantize/quantize.h"

namespace whittle {

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
  });
}

void require_writers(const Graph& graph, const std::string& format, const std::function<bool(const OpTraits&)>& has) {
  std::string missing;
  for (const Node& n : graph.nodes())
    if (!has(op_traits(n.op))) missing += (missing.empty() ? "" : ", ") + ("'" + n.name + "' (" + n.op + ")");
  if (missing.empty()) return;
  std::string with;
  for (const std::string& k : registered_ops())
    if (has(op_traits(k))) with += (with.empty() ? "" : ", ") + k;
  throw Error(format + " export: no " + format + " form for node " + missing + "; ops with one: " + with);
}

WHITTLE_REGISTER_MODULE("export", &register_export_writers)

}  // namespace whittle
