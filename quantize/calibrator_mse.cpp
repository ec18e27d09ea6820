// The MSE calibrator: the step whose grid gives the smallest squared quantization error over the
// values seen (rounding and clipping error together), searched over the histogram.
#include <algorithm>
#include <cmath>
#include <utility>

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
    auto squared_error = [&](double s) { return histogram_squared_error(h, grid, s); };
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
