#include "core/hdf5_util.h"


namespace whittle::hdf5 {

std::mutex& library_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace whittle::hdf5
