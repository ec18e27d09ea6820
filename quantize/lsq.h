#pragma once
// Learned Step Size Quantization (LSQ, Esser et al., 2020, arXiv:1902.08153) as a differentiable
// function, shared by the LSQ method (lsq.cpp) and its tests. Rounding is half-to-even.
//
// For a step s > 0 and an integer grid [−Q_N, Q_P]:
//   v = x / s,  x̂ = round(clamp(v, −Q_N, Q_P))·s
//   ∂x̂/∂x = 1 where −Q_N < v < Q_P, else 0                       (straight-through)
//   ∂x̂/∂s = (round(v) − v where −Q_N < v < Q_P; −Q_N where v ≤ −Q_N; Q_P where v ≥ Q_P)·g
// with the gradient scale g = 1/√(N·Q_P), N the elements one step quantizes (a weight tensor's,
// an output channel's, or an activation's per sample). The step's gradient is built from the
// incoming gradient of every element, including those outside the range (whose input gradient is
// masked). Weights use the signed grid [−2^(b−1), 2^(b−1) − 1], activations the unsigned [0, 2^b − 1].
// A step at or below a floor (a large learning rate can drive it there) quantizes with the floor
// and passes its gradient to the step unchanged, so the step can climb back; the method clamps the
// step to the floor after each optimizer step.

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "quantize/method.h"
#include "quantize/quantizers.h"

namespace whittle::quantize {

/// The integer grid [−q_n, q_p] of LSQ.
struct LsqGrid {
  int64_t q_n = 0;
  int64_t q_p = 255;
};

/// [−2^(bits−1), 2^(bits−1) − 1] (weights). Throws whittle::Error unless 2 ≤ bits ≤ 8.
LsqGrid lsq_signed_grid(int64_t bits);
/// [0, 2^bits − 1] (activations). Throws whittle::Error unless 1 ≤ bits ≤ 8.
LsqGrid lsq_unsigned_grid(int64_t bits);

/// The smallest step LSQ quantizes with in `dtype`: 1e-8, or float16's smallest normal number.
double lsq_step_floor(at::ScalarType dtype);

/// The paper's gradient scale 1/√(elements·q_p); 1 when either is 0.
double lsq_gradient_scale(int64_t elements, int64_t q_p);

/// x̂ = round(clamp(x/s, −q_n, q_p))·s with the gradients above (x any float tensor; `step` float
/// [1], or [C] per channel along `axis` of x; s = max(step, lsq_step_floor)). `gradient_scale` g
/// multiplies the step's gradient. With a defined `offset` β ([1], LSQ+, Bhalgat et al. 2020,
/// arXiv:2004.09576): x̂ = round(clamp((x − β)/s, −q_n, q_p))·s + β, v = (x − β)/s in the
/// gradients above, and ∂x̂/∂β = 1 outside the range (0 inside), times g. Throws whittle::Error for
/// a step whose size fits neither granularity, an axis out of range or an offset of other than one
/// element.
at::Tensor lsq_quantize(const at::Tensor& x, const at::Tensor& step, LsqGrid grid, double gradient_scale,
                        int64_t axis = 0, const at::Tensor& offset = {});

/// The step the paper initializes with: 2·mean|x|/√q_p, [1] over the whole tensor or [C] per
/// channel along `axis` (per_channel), at least lsq_step_floor. No gradient.
at::Tensor lsq_initial_step(const at::Tensor& x, LsqGrid grid, bool per_channel = false, int64_t axis = 0);

/// Codes c = round(clamp(w/s, −q_n, q_p)) + 2^(bits−1) and the scale s ([1] or [C]) of a signed
/// LSQ weight (Encoding::kUniform), whose decoding is bitwise lsq_quantize's value.
EncodedWeight lsq_encode(const at::Tensor& w, const at::Tensor& step, int64_t bits, int64_t axis = 0);

/// The learned step `act_step` ([1]) of an LSQ or LSQ+ act_quant node. Throws whittle::Error naming
/// the node when it has none.
const at::Tensor& lsq_act_step(const Node& node);
/// max(act_step, lsq_step_floor(float32)), the step its grid has, as a double.
double lsq_act_step_value(const Node& node);

/// The LSQ method entry under `name`: LSQ weights (the weight quantizer "lsq") and the activation
/// quantizer `activation_quantizer` ("lsq", or LSQ+'s "lsq_plus"), with their options, bit widths
/// (weights 2..8 or 32, activations 1..8 or 32; W4A4 by default), the step floor after each
/// optimizer step and reports labelled `label` ("LSQ" → "LSQ W4A4").
std::unique_ptr<QuantizerMethod> make_lsq_method(std::string name, std::string activation_quantizer,
                                                 std::string description, std::string label);

}  // namespace whittle::quantize
