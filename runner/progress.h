#pragma once
// The training progress line of `whittle run`.

#include <cstdint>
#include <iosfwd>
#include <string>

namespace whittle::runner {

/// Prints training progress to a stream. On a terminal (`tty`) one line is redrawn in place with a
/// bar after every batch; otherwise a plain line is printed every `log_every` batches (0: none)
/// and after the epoch's last batch:
///   epoch 2/8  [########................] 310/937  loss 0.0712  5120 img/s  ETA 0:12
class ProgressBar {
 public:
  ProgressBar(std::ostream& os, bool tty, int64_t log_every) : os_(os), tty_(tty), log_every_(log_every) {}
  /// After batch `batch` (0-based) of `batches` of epoch `epoch` (0-based) of `epochs`: the mean
  /// training `loss` so far, the throughput in images per second, the time left in the epoch in s.
  void update(int64_t epoch, int64_t epochs, int64_t batch, int64_t batches, double loss, double images_per_s,
              double eta_s);
  /// Ends the epoch's line (a newline on a terminal).
  void end_line();
  /// "m:ss" of a duration in seconds (negative: 0:00).
  static std::string format_eta(double seconds);

 private:
  std::ostream& os_;
  bool tty_;
  int64_t log_every_;
};

}  // namespace whittle::runner
