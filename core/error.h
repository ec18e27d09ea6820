#pragma once
// whittle::Error: the one exception type whittle throws for bad input and failed operations.

#include <stdexcept>
#include <string>

namespace whittle {

/// The kind of failure, which the command-line program maps to an exit code:
/// usage and recipe errors exit 2, everything else exits 1.
enum class ErrorKind {
  kRuntime,  ///< a failure while running (I/O, a corrupt file, a shape mismatch, an unsupported op)
  kUsage,    ///< bad command-line arguments or a bad recipe
};

/// Thrown for every error whittle detects itself. The message names what was wrong and where
/// (file, key, node, shape), e.g. "conv1: weight has shape [8, 3, 3, 3], expected in_channels 1".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorKind kind = ErrorKind::kRuntime)
      : std::runtime_error(what), kind_(kind) {}
  /// The kind of failure (see ErrorKind).
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

/// The message of `e` without a LibTorch C++ backtrace: what() up to "Exception raised from" or
/// the first "frame #" line, trimmed. For errors from ATen, the serializer or the JIT that are
/// passed on to users.
std::string message_of(const std::exception& e);

/// Throws whittle::Error(message) when `condition` is false.
inline void check(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

}  // namespace whittle
