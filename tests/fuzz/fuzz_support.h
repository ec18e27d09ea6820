#pragma once
// Shared pieces of the libFuzzer targets (docs/reliability.md "Fuzzing").
//
// The contract every target checks: whatever the bytes, a reader either returns or throws
// whittle::Error (a message naming the file and what is wrong). Any other exception escapes the
// target and libFuzzer reports it as a crash ("uncaught exception"), as it does a sanitizer report,
// a leak, a hang past -timeout or an allocation past -rss_limit_mb.

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace whittle::fuzz {

/// A per-process scratch folder on tmpfs (/dev/shm when it exists, else $TMPDIR or /tmp), created
/// on first use. Fuzz inputs that the readers take by path are written there.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string base = "/dev/shm";
    if (::access(base.c_str(), W_OK) != 0) base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
    std::string d = base + "/whittle-fuzz-" + std::to_string(::getpid());
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) std::abort();
    return d;
  }();
  return dir;
}

/// Writes data[0, size) to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

/// Runs `read`; a whittle::Error is the expected outcome for bad bytes and is swallowed. An error
/// without a message is a finding: every error must say what is wrong.
template <class F>
void expect_named_errors(F&& read) {
  try {
    read();
  } catch (const Error& e) {
    if (std::string(e.what()).empty()) std::abort();
  }
}

}  // namespace whittle::fuzz
