#include "export/writers.h"

#include <mutex>

#include "core/registration.h"
#include "fuse/fuse.h"
#include "quantize/quantize.h"

namespace whittle {

void register_export_writers() {
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
