// The MSE calibrator: the step whose grid gives the smallest squared quantization error over the
// values seen (rounding and clipping error together), searched over the histogram.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "quantize/calibrate.h"

namespace whittle::quantize {

namespace {

constexpr int kCandidates = 256;  // coarse steps s_max·k/256, then 64 between the best one's neighbours

}  // namespace

void register_mse_calibrator() {
  Calibrator c;
  c.name = "mse";
  c.description = "MSE: the step with the smallest squared quantization error over the values seen (histogram search)";
  c.step = [](const Histogram& h, const CalibrationGrid& grid, const CalibrationOptions&) {
    if (h.count == 0 || h.range == 0.0) return 1.0;  // no value but 0: any step is exact
    const double s_max = step_for_range(grid, h.min, h.max);
    // The values once: the occupied bins' centres with their counts, and the zeros.
    std::vector<std::pair<double, double>> values;
    if (h.zeros > 0) values.emplace_back(0.0, static_cast<double>(h.zeros));
    for (int64_t i = 0; i < static_cast<int64_t>(h.counts.size()); ++i)
      if (h.counts[i] != 0) values.emplace_back(h.center(i), static_cast<double>(h.counts[i]));
    const double lo_code = -static_cast<double>(grid.q_n), hi_code = static_cast<double>(grid.q_p);
    auto squared_error = [&](double s) {  // histogram_squared_error over `values`
      double sum = 0.0;
      for (const auto& [x, count] : values) {
        const double c = std::clamp(std::nearbyint((x - grid.offset) / s), lo_code, hi_code);
        const double d = x - (grid.offset + c * s);
        sum += count * d * d;
      }
      return sum;
    };
    auto search = [&](double lo, double hi, int n) {
      // The smallest error over lo + (hi − lo)·k/n, k = 1..n; ties to the larger step.
      double best = hi, best_error = HUGE_VAL;
      for (int k = 1; k <= n; ++k) {
        const double s = lo + (hi - lo) * k / n;
        const double e = squared_error(s);
        if (e <= best_error) {
          best = s;
          best_error = e;
        }
      }
      return best;
    };
    const double coarse = search(0.0, s_max, kCandidates);
    const double width = s_max / kCandidates;
    const double fine = search(std::max(coarse - width, 0.0), coarse + width, 64);
    return fine > 0.0 ? fine : s_max;
  };
  register_calibrator(std::move(c));
}

}  // namespace whittle::quantize
