#pragma once
// Calibration: statistics collected over batches (a Histogram) and calibrators, pure functions
// that compute a quantizer's step from them. Calibrators are entries of the calibrator registry
// (`whittle inspect --calibrators`), one file each (calibrator_minmax.cpp, calibrator_percentile.cpp,
// calibrator_mse.cpp, calibrator_entropy.cpp, calibrator_moving_minmax.cpp); the learned quantizers (LSQ's and LSQ+'s steps, PACT's clip levels) can
// start from them.
//
// The histogram counts in int64 over [−r, r] in kBins equal bins, r the smallest power of two
// above every |x| seen. When a batch goes past r, r doubles (as often as needed) and groups of
// bins merge exactly, so the counts do not depend on how the same values were split into batches
// or ranks (values are binned as float32: bitwise for values within 2^29 of r in magnitude,
// otherwise within one bin). Exact zeros (after
// a ReLU, often half the values) are counted apart, in `zeros`, so that a first batch of zeros
// needs no range and calibrators see them at 0 exactly.

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/registry.h"

namespace whittle::quantize {

/// Statistics of a stream of values (see the top of this file).
struct Histogram {
  static constexpr int64_t kBins = 2048;
  /// r: bins cover [−r, r); 0 until a non-zero value is seen.
  double range = 0.0;
  /// kBins counts of the non-zero values; bin i holds [−r + i·w, −r + (i + 1)·w), w = 2r/kBins.
  /// Empty while range is 0.
  std::vector<int64_t> counts;
  int64_t zeros = 0;  ///< values exactly 0
  int64_t count = 0;  ///< values seen, zeros included
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double abs_sum = 0.0;  ///< Σ|x|, for the paper's LSQ step
  /// The averaging constant c of the moving averages below (torch.ao's MovingAverageMinMaxObserver).
  static constexpr double kMovingAverage = 0.01;
  /// Moving averages of each batch's min and max (observe() calls with values): the first batch's,
  /// then m ← m + c·(batch − m). Unlike the rest, they depend on how the values were split.
  double moving_min = 0.0;
  double moving_max = 0.0;
  int64_t batches = 0;  ///< observe() calls that saw values

  /// The bin width 2r/kBins (0 while range is 0).
  double bin_width() const { return range > 0 ? 2.0 * range / static_cast<double>(kBins) : 0.0; }
  /// The centre of bin i.
  double center(int64_t i) const { return -range + (static_cast<double>(i) + 0.5) * bin_width(); }
};

/// Adds every value of `x` (any shape, any float dtype; binned as float32, min, max and Σ|x| in
/// double) to `h`. Throws whittle::Error (runtime) naming `what` for a NaN, an infinity or a value
/// outside float32's range, leaving `h` unchanged.
void observe(Histogram& h, const at::Tensor& x, const std::string& what = "calibration input");

/// The histogram of the values of `x` alone.
Histogram histogram_of(const at::Tensor& x, const std::string& what = "calibration input");

/// Merges `other` into `h` (the same values seen by two observers). The moving averages become
/// the batch-weighted mean of both.
void merge(Histogram& h, const Histogram& other);

/// Merges the histograms of every rank of a data-parallel run into `h` on each rank, so that every
/// rank computes the same step: `sum` sums a tensor in place over the ranks (every rank calls this
/// with its own `h` in the same order); `rank` in [0, ranks).
void merge_over_ranks(Histogram& h, const std::function<void(at::Tensor&)>& sum, int64_t rank, int64_t ranks);

/// The integer grid a step is calibrated for: values offset + s·c for integral c ∈ [−q_n, q_p].
struct CalibrationGrid {
  int64_t q_n = 0;
  int64_t q_p = 255;
  double offset = 0.0;
};

/// Settings some calibrators read.
struct CalibrationOptions {
  /// percentile: the share of |x − offset| the grid covers unclipped, in percent (0, 100].
  double percentile = 99.99;
};

/// One calibrator: computes a step s > 0 for `grid` from the statistics. Every value 0 (or no
/// value) gives s = 1. Pure: the same statistics give the same step.
struct Calibrator {
  std::string name;
  std::string description;  ///< one line, with the method's source
  std::function<double(const Histogram& h, const CalibrationGrid& grid, const CalibrationOptions& options)> step;
};

/// The calibrator registry ("calibrators" in `whittle inspect`).
Registry<Calibrator>& calibrators();
/// Registers (or replaces) a calibrator. Throws whittle::Error for one without a name or step.
void register_calibrator(Calibrator c);
/// The calibrator `name`; throws whittle::Error (usage) naming it and listing the known ones.
const Calibrator& calibrator(const std::string& name);

/// How a method's learned parameters start from data: the calibrator, how many training batches
/// its statistics come from, and its settings.
struct Calibration {
  std::string calibrator;
  int64_t batches = 1;
  CalibrationOptions options;
};

/// For calibrators: the squared quantization error Σ count·(c − q(c))² of the histogram's bin
/// centres c and its zeros on `grid` with step `step` (q rounds half to even and clamps to the
/// grid). Units: the values' squared.
double histogram_squared_error(const Histogram& h, const CalibrationGrid& grid, double step);
/// The step for which the grid's ends reach `lo` and `hi` (the largest of (hi − offset)/q_p and
/// (offset − lo)/q_n over the sides with levels); 1 when that is not positive.
double step_for_range(const CalibrationGrid& grid, double lo, double hi);

/// The shipped calibrators, one file each, registered by the quantize module.
void register_minmax_calibrator();
void register_percentile_calibrator();
void register_mse_calibrator();
void register_entropy_calibrator();
void register_moving_minmax_calibrator();

}  // namespace whittle::quantize
