// The entropy calibrator (TensorRT's INT8 entropy calibration, Migacz, "8-bit Inference with
// TensorRT", GTC 2017): the clipping threshold T whose quantized distribution is closest to the
// values' own in Kullback-Leibler divergence.
//
// On the histogram of the distances |x − offset| (quantize/calibrate.h; bins of the histogram's
// width w, a value on a side of the offset without levels at 0), for
// each candidate i from L + 1 to the last non-empty bin (L: the grid's steps from its offset to
// its nearer end, 127 for int8, 255 for uint8 after a ReLU):
//   P = the first i bins, the values beyond them added to bin i − 1 (clipped to T = i·w);
//   Q = the first i bins merged into L + 1 groups (group g: bins ⌊g·i/(L + 1)⌋ up to
//       ⌊(g + 1)·i/(L + 1)⌋), each group's count spread evenly over its non-empty bins (empty bins
//       stay empty);
//   KL(P ‖ Q) of the normalized distributions, Q smoothed on its counts first: each empty bin gets
//   1e-4, taken evenly from the others (MXNet's and TensorRT's smoothing).
// A grid whose two sides differ by more than a level (uint8 with a zero point inside) gets min-max's
// step: the search scores one clip distance for both sides.
// The step is T/L for the smallest divergence (the smallest i on ties), never more than min-max's;
// with no more bins than L + 1, min-max's step (nothing to clip).
// Exact zeros (counted apart by the histogram: after a ReLU, often half the values) are left out
// when the grid's offset is 0: such a grid holds 0 exactly, so they cost nothing at any T, whereas in the first bin they
// would outweigh everything else there, and Q, which spreads that bin's group evenly over its
// non-empty bins, would misplace most of that weight whenever the group holds more than one bin.
#include <algorithm>
#include <cmath>
#include <vector>

#include "quantize/calibrate.h"

namespace whittle::quantize {

namespace {

// KL(P ‖ Q) of two histograms of counts of the same length, normalized here. Q is smoothed on its
// counts first, as MXNet's and TensorRT's searches do: each empty bin gets 1e-4 and the non-empty
// ones give that up evenly, never below half their count (so a bin of P with no counterpart in Q
// costs a finite, large term).
double divergence(const std::vector<double>& p, std::vector<double> q) {
  constexpr double kEps = 1e-4;
  int64_t zeros = 0, nonzeros = 0;
  for (double v : q) (v > 0.0 ? nonzeros : zeros) += 1;
  if (nonzeros == 0) return HUGE_VAL;
  const double taken = kEps * static_cast<double>(zeros) / static_cast<double>(nonzeros);
  double p_sum = 0.0, q_sum = 0.0;
  for (size_t k = 0; k < q.size(); ++k) {
    q[k] = q[k] > 0.0 ? std::max(q[k] - taken, 0.5 * q[k]) : kEps;
    p_sum += p[k];
    q_sum += q[k];
  }
  if (p_sum <= 0.0) return HUGE_VAL;
  double kl = 0.0;
  for (size_t k = 0; k < p.size(); ++k) {
    if (p[k] <= 0.0) continue;
    const double pk = p[k] / p_sum, qk = q[k] / q_sum;
    kl += pk * std::log(pk / qk);
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
    // The search folds both sides onto one distance axis: it is TensorRT's for a grid symmetric
    // about its offset (within a level: int8's [−128, 127]) or with levels on one side only. An
    // asymmetric grid (uint8 with a zero point inside) would clip its longer side elsewhere than
    // the search scores: min-max's step there.
    if (grid.q_n > 0 && grid.q_p > 0 && std::abs(grid.q_n - grid.q_p) > 1) return s_max;
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
