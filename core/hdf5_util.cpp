#include "core/hdf5_util.h"


namespace whittle::hdf5 {

std::mutex& library_mutex() {
  // HDF5 closes itself at exit; after a damaged file left an object it could not close, that
  // prints "HDF5: infinite loop closing library" and a list of its interfaces to stderr. The
  // process is ending anyway: HDF5 is told not to (before its first call, which this precedes).
  static const bool no_atexit = [] { return H5dont_atexit() >= 0; }();
  (void)no_atexit;
  static std::mutex m;
  return m;
}

}  // namespace whittle::hdf5
