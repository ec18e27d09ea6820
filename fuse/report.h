#pragma once
// What a fusion pass did: the rewrites it made and the patterns it left alone, with reasons.

#include <string>
#include <vector>

namespace whittle::fuse {

/// The report every pass in fuse/ returns. A pattern that does not qualify is not an error: it
/// is left as it is and listed in `skipped` with the reason.
struct Report {
  std::string pass;                  ///< pass name ("fold_batchnorm", "repvgg", ...)
  std::vector<std::string> fused;    ///< one line per rewrite, in the order applied, e.g. "conv1 ← bn1"
  std::vector<std::string> skipped;  ///< "<node>: <reason>" for candidates left alone
  /// Appends another report's lines (prefixing each with its pass name when it differs).
  void append(const Report& other);
  /// Human-readable lines: "<pass>: fused N" then one line per rewrite and per skip.
  std::string summary() const;
};

}  // namespace whittle::fuse
