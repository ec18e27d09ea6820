// The entropy calibrator (TensorRT's INT8 entropy calibration, Migacz, "8-bit Inference with
// TensorRT", GTC 2017): the clipping threshold T whose quantized distribution is closest to the
// values' own in Kullback-Leibler divergence.
//
// On the histogram of the distances |x − offset| (quantize/calibrate.h; bins of the histogram's
// width w, a value on a side of the offset without levels at 0), for
// each candidate i from L + 1 to the last non-empty bin (L: the grid's steps from its offset to
// its nearer end, 127 for int8, 255 for uint8 after a ReLU):
//   P = the first i bins, the values beyond them added to bin i − 1 (clipped to T = i·w);
//   Q = the first i bins merged into L + 1 groups (bin k in group ⌊k·(L + 1)/i⌋), each group's
//       count spread evenly over its non-empty bins (empty bins stay empty);
//   KL(P ‖ Q) of the normalized distributions, Q's empty bins given 1e-4 of the mass (taken evenly
//   from the others) where P has values.
// The step is T/L for the smallest divergence (the smallest i on ties), never more than min-max's;
// with no more bins than L + 1, min-max's step (nothing to clip).
// Exact zeros (counted apart by the histogram: after a ReLU, often half the values) are left out
// when the grid's offset is 0: such a grid holds 0 exactly, so they cost nothing at any T, whereas in the first bin they
// would outweigh everything else there, and Q, which spreads that bin's group evenly, would push T
// to the smallest candidate (measured: a LeNet-5 lost 1.9 points of top-1 so, none without them).
#include <algorithm>
#include <cmath>
#include <vector>

#include "quantize/calibrate.h"

namespace whittle::quantize {

namespace {

// KL(P ‖ Q) of two histograms of the same length (normalized here), Q smoothed as above.
double divergence(const std::vector<double>& p, const std::vector<double>& q) {
  double p_sum = 0.0, q_sum = 0.0;
  int64_t q_zeros = 0, q_nonzeros = 0;
  for (size_t k = 0; k < p.size(); ++k) {
    p_sum += p[k];
    q_sum += q[k];
    (q[k] > 0.0 ? q_nonzeros : q_zeros) += 1;
  }
  if (p_sum <= 0.0 || q_sum <= 0.0 || q_nonzeros == 0) return HUGE_VAL;
  constexpr double kEps = 1e-4;
  const double taken = kEps * static_cast<double>(q_zeros) / static_cast<double>(q_nonzeros);
  double kl = 0.0;
  for (size_t k = 0; k < p.size(); ++k) {
    if (p[k] <= 0.0) continue;
    const double pk = p[k] / p_sum;
    const double qk = q[k] > 0.0 ? q[k] / q_sum - taken : kEps;
    kl += pk * std::log(pk / std::max(qk, 1e-300));
  }
  return kl;
}

}  // namespace

void register_entropy_calibrator() {
  Calibrator c;
  c.name = "entropy";
  c.description =
      "entropy: the clipping threshold with the smallest KL divergence between the values and their quantized "
      "histogram (TensorRT's INT8 entropy calibration)";
  c.step = [](const Histogram& h, const CalibrationGrid& grid, const CalibrationOptions&) {
    if (h.count == 0 || h.range == 0.0) return 1.0;
    const double s_max = step_for_range(grid, h.min, h.max);
    const int64_t levels = grid.q_n > 0 && grid.q_p > 0 ? std::min(grid.q_n, grid.q_p) : std::max(grid.q_n, grid.q_p);
    if (levels <= 0) return s_max;
    // The distance histogram.
    const double w = h.bin_width();
    auto distance = [&](double x) {
      const double d = x - grid.offset;
      if (d >= 0) return grid.q_p > 0 ? d : 0.0;
      return grid.q_n > 0 ? -d : 0.0;
    };
    std::vector<double> bins(static_cast<size_t>(Histogram::kBins), 0.0);
    auto add = [&](double x, int64_t count) {
      const auto j = std::min<int64_t>(static_cast<int64_t>(std::floor(distance(x) / w)), Histogram::kBins - 1);
      bins[static_cast<size_t>(j)] += static_cast<double>(count);
    };
    if (h.zeros > 0 && grid.offset != 0.0) add(0.0, h.zeros);  // on a shifted grid 0 may fall between levels
    for (int64_t i = 0; i < static_cast<int64_t>(h.counts.size()); ++i)
      if (h.counts[i] != 0) add(h.center(i), h.counts[i]);
    int64_t used = Histogram::kBins;
    while (used > 0 && bins[static_cast<size_t>(used - 1)] == 0.0) --used;
    const int64_t groups = levels + 1;
    if (used <= groups) return s_max;
    double best_kl = HUGE_VAL;
    int64_t best = used;
    std::vector<double> p, q;
    for (int64_t i = groups; i <= used; ++i) {
      p.assign(bins.begin(), bins.begin() + i);
      double beyond = 0.0;
      for (int64_t k = i; k < used; ++k) beyond += bins[static_cast<size_t>(k)];
      p[static_cast<size_t>(i - 1)] += beyond;
      q.assign(static_cast<size_t>(i), 0.0);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t start = g * i / groups, stop = (g + 1) * i / groups;
        double sum = 0.0;
        int64_t nonempty = 0;
        for (int64_t k = start; k < stop; ++k) {
          sum += bins[static_cast<size_t>(k)];
          nonempty += bins[static_cast<size_t>(k)] != 0.0;
        }
        if (nonempty == 0) continue;
        for (int64_t k = start; k < stop; ++k)
          if (bins[static_cast<size_t>(k)] != 0.0) q[static_cast<size_t>(k)] = sum / static_cast<double>(nonempty);
      }
      const double kl = divergence(p, q);
      if (kl < best_kl) {
        best_kl = kl;
        best = i;
      }
    }
    const double s = static_cast<double>(best) * w / static_cast<double>(levels);
    return s > 0.0 ? std::min(s, s_max) : s_max;
  };
  register_calibrator(std::move(c));
}

}  // namespace whittle::quantize
