#include "export/writers.h"

#include <mutex>

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

WHITTLE_REGISTER_MODULE("export", &register_export_writers)

}  // namespace whittle
