#include "quantize/calibrate.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"

namespace whittle::quantize {

namespace {

constexpr int64_t kHalf = Histogram::kBins / 2;

// Widens h's range to `range` (a power of two times h.range): bin i of the old range lands in bin
// (i + kHalf·(2^k − 1)) / 2^k of the new, 2^k = range / h.range, which holds exactly the old bin's
// values (0 is a bin edge of every range).
void grow(Histogram& h, double range) {
  int k = 0;
  for (double r = h.range; r < range; r *= 2.0) ++k;
  if (k == 0) return;
  std::vector<int64_t> counts(Histogram::kBins, 0);
  for (int64_t i = 0; i < Histogram::kBins; ++i) {
    if (h.counts[i] == 0) continue;
    const int64_t j = k <= 11 ? (i + kHalf * ((int64_t{1} << k) - 1)) >> k : (i < kHalf ? kHalf - 1 : kHalf);
    counts[j] += h.counts[i];
  }
  h.counts = std::move(counts);
  h.range = range;
}

}  // namespace

void observe(Histogram& h, const at::Tensor& x_in, const std::string& what) {
  if (!x_in.defined() || x_in.numel() == 0) return;
  at::NoGradGuard no_grad;
  const at::Tensor given = x_in.detach().reshape({-1});
  // Binned as float32 (whose sums with r below are exact in double); min, max and Σ|x| as given.
  const at::Tensor x = given.to(at::kDouble);
  const at::Tensor binned_values = given.to(at::kFloat).to(at::kDouble);
  if (!at::isfinite(binned_values).all().item<bool>())
    throw Error(what + ": a NaN, infinite or beyond-float32 value among " + std::to_string(x.numel()) +
                    " (calibration needs finite values)",
                ErrorKind::kRuntime);
  const at::Tensor nonzero_mask = binned_values.ne(0.0);
  const at::Tensor nonzero = binned_values.masked_select(nonzero_mask);
  const int64_t n = x.numel();
  const int64_t nz = nonzero.numel();
  const double lo = x.min().item<double>();
  const double hi = x.max().item<double>();
  const double abs_sum = x.abs().sum().item<double>();
  std::vector<int64_t> add;
  double range = h.range;
  if (nz > 0) {
    // r: the smallest power of two strictly above max|x| (frexp: |x| = m·2^e, 0.5 ≤ m < 1).
    int e = 0;
    std::frexp(nonzero.abs().max().item<double>(), &e);
    range = std::max(range, std::ldexp(1.0, e));
    const double per_unit = static_cast<double>(Histogram::kBins) / (2.0 * range);  // a power of two: exact
    const at::Tensor index = ((nonzero + range) * per_unit).floor().clamp(0, Histogram::kBins - 1).to(at::kLong);
    const at::Tensor binned = at::bincount(index, {}, Histogram::kBins).to(at::kCPU, at::kLong).contiguous();
    add.assign(binned.data_ptr<int64_t>(), binned.data_ptr<int64_t>() + Histogram::kBins);
  }
  // Everything read: now change h.
  if (nz > 0) {
    if (h.range == 0.0) {
      h.range = range;
      h.counts.assign(Histogram::kBins, 0);
    } else {
      grow(h, range);
    }
    for (int64_t i = 0; i < Histogram::kBins; ++i) h.counts[i] += add[i];
  }
  h.zeros += n - nz;
  h.count += n;
  h.min = std::min(h.min, lo);
  h.max = std::max(h.max, hi);
  h.abs_sum += abs_sum;
  if (h.batches == 0) {
    h.moving_min = lo;
    h.moving_max = hi;
  } else {
    h.moving_min += Histogram::kMovingAverage * (lo - h.moving_min);
    h.moving_max += Histogram::kMovingAverage * (hi - h.moving_max);
  }
  ++h.batches;
}

Histogram histogram_of(const at::Tensor& x, const std::string& what) {
  Histogram h;
  observe(h, x, what);
  return h;
}

void merge(Histogram& h, const Histogram& other) {
  if (other.range > 0.0) {
    Histogram o = other;
    if (h.range == 0.0) {
      h.range = o.range;
      h.counts.assign(Histogram::kBins, 0);
    }
    const double range = std::max(h.range, o.range);
    grow(h, range);
    grow(o, range);
    for (int64_t i = 0; i < Histogram::kBins; ++i) h.counts[i] += o.counts[i];
  }
  h.zeros += other.zeros;
  h.count += other.count;
  h.min = std::min(h.min, other.min);
  h.max = std::max(h.max, other.max);
  h.abs_sum += other.abs_sum;
  if (other.batches > 0) {
    const double total = static_cast<double>(h.batches + other.batches);
    const double mine = static_cast<double>(h.batches) / total, theirs = static_cast<double>(other.batches) / total;
    h.moving_min = mine * h.moving_min + theirs * other.moving_min;
    h.moving_max = mine * h.moving_max + theirs * other.moving_max;
    h.batches += other.batches;
  }
}

void merge_over_ranks(Histogram& h, const std::function<void(at::Tensor&)>& sum, int64_t rank, int64_t ranks) {
  if (!sum || ranks <= 1) return;
  if (rank < 0 || rank >= ranks)
    throw Error("calibrate: rank " + std::to_string(rank) + " outside [0, " + std::to_string(ranks) + ")");
  const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
  // The widest range: a one-hot of each rank's exponent (float32 ranges are 2^−148 .. 2^128).
  constexpr int kLowest = -160, kExponents = 320;
  at::Tensor exponents = at::zeros({kExponents}, f64);
  if (h.range > 0.0) {
    const int e = std::ilogb(h.range) - kLowest;
    if (e < 0 || e >= kExponents) throw Error("calibrate: histogram range " + std::to_string(h.range) + " outside float32's");
    exponents[e] = 1.0;
  }
  sum(exponents);
  const at::Tensor present = exponents.cpu().nonzero();
  const double range = present.numel() == 0 ? 0.0 : std::ldexp(1.0, static_cast<int>(present.max().item<int64_t>()) + kLowest);
  if (range > 0.0) {
    if (h.range == 0.0) {
      h.range = range;
      h.counts.assign(Histogram::kBins, 0);
    }
    grow(h, range);
  }
  // Counts, zeros, count and batches in int64; Σ|x| and the batch-weighted moving averages; each
  // rank's min and max in its own slots.
  at::Tensor counts = at::zeros({Histogram::kBins + 3}, at::kLong);
  if (!h.counts.empty()) std::copy(h.counts.begin(), h.counts.end(), counts.data_ptr<int64_t>());
  counts[Histogram::kBins] = h.zeros;
  counts[Histogram::kBins + 1] = h.count;
  counts[Histogram::kBins + 2] = h.batches;
  at::Tensor reals = at::zeros({2 * ranks + 3}, f64);
  reals[2 * rank] = h.min;
  reals[2 * rank + 1] = h.max;
  reals[2 * ranks] = h.abs_sum;
  reals[2 * ranks + 1] = h.moving_min * static_cast<double>(h.batches);
  reals[2 * ranks + 2] = h.moving_max * static_cast<double>(h.batches);
  sum(counts);
  sum(reals);
  counts = counts.cpu().contiguous();
  reals = reals.cpu().contiguous();
  const int64_t* c = counts.data_ptr<int64_t>();
  if (range > 0.0) h.counts.assign(c, c + Histogram::kBins);
  h.zeros = c[Histogram::kBins];
  h.count = c[Histogram::kBins + 1];
  h.batches = c[Histogram::kBins + 2];
  const double* r = reals.data_ptr<double>();
  for (int64_t i = 0; i < ranks; ++i) {
    h.min = std::min(h.min, r[2 * i]);
    h.max = std::max(h.max, r[2 * i + 1]);
  }
  h.abs_sum = r[2 * ranks];
  if (h.batches > 0) {
    h.moving_min = r[2 * ranks + 1] / static_cast<double>(h.batches);
    h.moving_max = r[2 * ranks + 2] / static_cast<double>(h.batches);
  }
}

double histogram_squared_error(const Histogram& h, const CalibrationGrid& grid, double step) {
  const double lo = -static_cast<double>(grid.q_n);
  const double hi = static_cast<double>(grid.q_p);
  auto error = [&](double x) {
    const double c = std::clamp(std::nearbyint((x - grid.offset) / step), lo, hi);  // half to even
    const double d = x - (grid.offset + c * step);
    return d * d;
  };
  double sum = h.zeros > 0 ? static_cast<double>(h.zeros) * error(0.0) : 0.0;
  for (int64_t i = 0; i < static_cast<int64_t>(h.counts.size()); ++i)
    if (h.counts[i] != 0) sum += static_cast<double>(h.counts[i]) * error(h.center(i));
  return sum;
}

double step_for_range(const CalibrationGrid& grid, double lo, double hi) {
  double s = 0.0;
  if (grid.q_p > 0) s = std::max(s, (hi - grid.offset) / static_cast<double>(grid.q_p));
  if (grid.q_n > 0) s = std::max(s, (grid.offset - lo) / static_cast<double>(grid.q_n));
  return s > 0.0 && std::isfinite(s) ? s : 1.0;
}

Registry<Calibrator>& calibrators() {
  static Registry<Calibrator> r("calibrator", "calibrators", [](const Calibrator& c) { return c.description; });
  return r;
}

void register_calibrator(Calibrator c) {
  if (c.name.empty() || !c.step) throw Error("register_calibrator: '" + c.name + "' needs a name and a step function");
  const std::string name = c.name;
  calibrators().add(name, std::move(c));
}

const Calibrator& calibrator(const std::string& name) { return calibrators().get(name); }

}  // namespace whittle::quantize
