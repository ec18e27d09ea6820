// The percentile calibrator: the grid covers the given share of the values' distances from its
// offset, clipping the rest (as TensorRT's and ONNX Runtime's percentile calibration).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "quantize/calibrate.h"

namespace whittle::quantize {

void register_percentile_calibrator() {
  Calibrator c;
  c.name = "percentile";
  c.description = "percentile: the grid covers the given percentile of |x − offset| (option percentile, 99.99 by default)";
  c.step = [](const Histogram& h, const CalibrationGrid& grid, const CalibrationOptions& o) {
    if (!(o.percentile > 0.0 && o.percentile <= 100.0))
      throw Error("percentile calibrator: percentile " + std::to_string(o.percentile) + " outside (0, 100]",
                  ErrorKind::kUsage);
    const double s_max = step_for_range(grid, h.min, h.max);
    if (h.count == 0) return 1.0;
    // The distance of x from the offset on the sides the grid has levels on; a value on a side
    // without levels is clipped to the offset whatever the step, so it counts at distance 0.
    auto distance = [&](double x) {
      const double d = x - grid.offset;
      if (d >= 0) return grid.q_p > 0 ? d : 0.0;
      return grid.q_n > 0 ? -d : 0.0;
    };
    // (distance, count): the zeros, and each bin at its far edge from the offset.
    std::vector<std::pair<double, int64_t>> by_distance;
    if (h.zeros > 0) by_distance.emplace_back(distance(0.0), h.zeros);
    const double half = 0.5 * h.bin_width();
    for (int64_t i = 0; i < static_cast<int64_t>(h.counts.size()); ++i) {
      if (h.counts[i] == 0) continue;
      const double d = distance(h.center(i));
      by_distance.emplace_back(d > 0 ? d + half : 0.0, h.counts[i]);
    }
    std::sort(by_distance.begin(), by_distance.end());
    // The smallest distance covering ⌈p·count/100⌉ values (the tolerance keeps 99.9 % of 1,000
    // values at 999, not 1,000 by a rounding of the product).
    const int64_t wanted = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(o.percentile / 100.0 * static_cast<double>(h.count) * (1.0 - 1e-12))));
    double t = 0.0;
    int64_t seen = 0;
    for (const auto& [d, count] : by_distance) {
      seen += count;
      t = d;
      if (seen >= wanted) break;
    }
    // Clipped at ±t around the offset, never past the values seen; when the share is covered at
    // distance 0 (mostly zeros), min-max's step.
    const double levels = static_cast<double>(grid.q_n > 0 && grid.q_p > 0 ? std::min(grid.q_n, grid.q_p)
                                                                            : std::max(grid.q_n, grid.q_p));
    const double s = std::min(t / levels, s_max);
    return s > 0.0 ? s : s_max;
  };
  register_calibrator(std::move(c));
}

}  // namespace whittle::quantize
