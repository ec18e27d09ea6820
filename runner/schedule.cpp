#include "runner/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace whittle::runner {

namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

double learning_rate_at(const ScheduleSpec& s, double lr, double e, double total) {
  double rate = lr;
  if (s.name == "constant") {
    rate = lr;
  } else if (s.name == "step") {
    rate = lr * std::pow(s.gamma, std::floor(e / s.step_size));
  } else if (s.name == "multistep") {
    int passed = 0;
    for (double m : s.milestones) passed += e >= m ? 1 : 0;
    rate = lr * std::pow(s.gamma, passed);
  } else if (s.name == "cosine") {
    double f = std::min(1.0, std::max(0.0, e / total));
    rate = s.min_lr + (lr - s.min_lr) * 0.5 * (1 + std::cos(kPi * f));
  } else if (s.name == "linear") {
    // From lr to min_lr in a straight line over the run (ReActNet's decay).
    double f = std::min(1.0, std::max(0.0, e / total));
    rate = lr + (s.min_lr - lr) * f;
  } else if (s.name == "one_cycle") {
    const double peak = s.max_lr > 0 ? s.max_lr : lr;
    const double start = peak / 25.0, end = peak / 1e4;
    const double f = std::min(1.0, std::max(0.0, e / total));
    if (f < s.pct_start) {
      double p = f / s.pct_start;
      rate = peak + (start - peak) * 0.5 * (1 + std::cos(kPi * p));
    } else {
      double p = (f - s.pct_start) / std::max(1e-12, 1 - s.pct_start);
      rate = end + (peak - end) * 0.5 * (1 + std::cos(kPi * p));
    }
  } else {
    throw Error("unknown lr_schedule '" + s.name + "'", ErrorKind::kUsage);
  }
  if (s.warmup_epochs > 0 && e < s.warmup_epochs) rate *= e / s.warmup_epochs;
  return rate;
}

}  // namespace whittle::runner
