// Portable variant of the quantizer microkernels (quantize/quantize_simd.h): the scalar loops.
#include "quantize/quantize_simd.h"

namespace whittle::quantize::detail {
namespace {

void dorefa_activation_scalar(const float* x, float* y, uint8_t* mask, int64_t n, float clip, float levels,
                              bool unit_clip, bool after_relu) {
  dorefa_activation_tail(x, y, mask, 0, n, clip, levels, unit_clip, after_relu);
}

void sign_scalar(const float* x, float* y, uint8_t* mask, int64_t n) { sign_tail(x, y, mask, 0, n); }

void mask_multiply_scalar(const float* g, const uint8_t* mask, float* dx, int64_t n) {
  mask_multiply_tail(g, mask, dx, 0, n);
}

void lsq_backward_scalar(const float* x, const float* g, float* dx, int64_t n, float s, float b, float lo, float hi,
                         float* ds, float* db) {
  lsq_backward_tail(x, g, dx, 0, n, s, b, lo, hi, ds, db);
}

}  // namespace

const QuantizeSimd kQuantizeSimdScalar = {dorefa_activation_scalar, sign_scalar, mask_multiply_scalar,
                                          lsq_backward_scalar};

}  // namespace whittle::quantize::detail
