#include "runner/progress.h"

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <sstream>

namespace whittle::runner {

void ProgressBar::update(int64_t epoch, int64_t epochs, int64_t batch, int64_t batches, double loss,
                         double images_per_s, double eta_s) {
  if (!tty_ && (log_every_ <= 0 || (batch + 1) % log_every_ != 0) && batch + 1 != batches) return;
  std::ostringstream line;
  line << "epoch " << epoch + 1 << "/" << epochs << "  ";
  if (tty_) {
    const int width = 24;
    int filled = static_cast<int>(width * (batch + 1) / std::max<int64_t>(batches, 1));
    line << "[" << std::string(static_cast<size_t>(filled), '#')
         << std::string(static_cast<size_t>(width - filled), '.') << "] ";
  }
  line << batch + 1 << "/" << batches << "  loss " << std::fixed << std::setprecision(4) << loss << "  "
       << std::setprecision(0) << images_per_s << " img/s  ETA " << format_eta(eta_s);
  if (tty_)
    os_ << "\r" << line.str() << "\033[K" << std::flush;
  else
    os_ << line.str() << "\n" << std::flush;
}

void ProgressBar::end_line() {
  if (tty_) os_ << "\n";
}

std::string ProgressBar::format_eta(double s) {
  int64_t t = static_cast<int64_t>(std::max(0.0, s));
  std::ostringstream o;
  o << t / 60 << ":" << std::setw(2) << std::setfill('0') << t % 60;
  return o.str();
}

}  // namespace whittle::runner
