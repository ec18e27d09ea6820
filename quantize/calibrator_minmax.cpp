// The min-max calibrator: the grid's ends reach the smallest and largest value seen (no clipping).
#include "quantize/calibrate.h"

namespace whittle::quantize {

void register_minmax_calibrator() {
  Calibrator c;
  c.name = "minmax";
  c.description = "min-max: the grid reaches the smallest and largest value seen, nothing clipped";
  c.step = [](const Histogram& h, const CalibrationGrid& grid, const CalibrationOptions&) {
    return h.count == 0 ? 1.0 : step_for_range(grid, h.min, h.max);
  };
  register_calibrator(std::move(c));
}

}  // namespace whittle::quantize
