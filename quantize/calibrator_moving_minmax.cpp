// The moving-average min-max calibrator (torch.ao's MovingAverageMinMaxObserver): the grid's ends
// reach the moving averages of each batch's smallest and largest value, m ← m + 0.01·(batch − m)
// from the first batch's (quantize/calibrate.h, Histogram::moving_min and moving_max).
#include "quantize/calibrate.h"

namespace whittle::quantize {

void register_moving_minmax_calibrator() {
  Calibrator c;
  c.name = "moving_minmax";
  c.description =
      "moving-average min-max: the grid reaches the moving averages (constant 0.01) of each batch's smallest and "
      "largest value, as torch.ao's MovingAverageMinMaxObserver";
  c.step = [](const Histogram& h, const CalibrationGrid& grid, const CalibrationOptions&) {
    return h.batches == 0 ? 1.0 : step_for_range(grid, h.moving_min, h.moving_max);
  };
  register_calibrator(std::move(c));
}

}  // namespace whittle::quantize
