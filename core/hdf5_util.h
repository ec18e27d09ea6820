#pragma once
// HDF5 helpers shared by the checkpoint writer/reader (export/) and the dataset reader/writer
// (data/): an owning handle, a scoped guard that keeps HDF5 from printing
// its error stack, and the lock that serializes calls into a non-thread-safe HDF5 build.
// (The file signature check, is_hdf5_file, is in core/file_util.h.) Internal to whittle's modules (not installed).

#include <hdf5.h>

#include <mutex>
#include <string>

namespace whittle::hdf5 {

/// Owns one HDF5 identifier and closes it with the matching H5*close (H5Fclose, H5Dclose...).
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  ~Handle() { close(); }
  hid_t get() const { return id_; }
  /// False when the call that made the identifier failed (negative id).
  bool valid() const { return id_ >= 0; }
  /// Closes now; false when closing failed (for files: buffered data could not be written).
  bool close() {
    const herr_t rc = id_ >= 0 && close_ ? close_(id_) : 0;
    id_ = -1;
    return rc >= 0;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

/// While alive, HDF5 prints no error stacks to stderr (whittle reports its own messages); the
/// previous handler is restored on destruction.
class SilenceErrors {
 public:
  SilenceErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~SilenceErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  SilenceErrors(const SilenceErrors&) = delete;
  SilenceErrors& operator=(const SilenceErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

/// The process-wide lock to hold around HDF5 calls (Debian's libhdf5 is not built thread-safe).
std::mutex& library_mutex();

}  // namespace whittle::hdf5
