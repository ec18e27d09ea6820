// LSQ+ (Bhalgat et al., 2020, arXiv:2004.09576): the activation quantizer "lsq_plus", LSQ's learned
// step with a learned offset β for inputs that can be negative (after Swish or h-swish, or a layer
// input no ReLU precedes), and the method "lsq_plus" (LSQ weights, LSQ+ activations).
//
//   x̂ = round(clamp((x − β)/s, 0, 2^k − 1))·s + β;  ∂x̂/∂β = 1 outside the grid's range, 0 inside
// (the step's and the input's gradients as LSQ's, with v = (x − β)/s; the paper's gradient scale g
// on both). A node that stands for a ReLU too (relu = 1) has no offset: its input's negative part
// is the ReLU's zero, which the unsigned grid gives already.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "core/error.h"
#include "graph/op_registry.h"
#include "quantize/lsq.h"
#include "quantize/method.h"

namespace whittle::quantize {

namespace {

// The learned offset of an LSQ+ node, undefined where it stands for a ReLU (no offset).
at::Tensor offset_of(const Node& n) {
  if (n.attr_bool("relu")) return {};
  const at::Tensor* b = n.params.find("act_offset");
  if (!b || !b->defined() || b->numel() != 1)
    node_fail(n, "LSQ+ activations need a learned parameter 'act_offset' of one element");
  return *b;
}

}  // namespace

void register_lsq_plus() {
  ActivationQuantizer a;
  a.name = "lsq_plus";
  a.description =
      "LSQ+ activations (Bhalgat et al. 2020): s·round(clamp((x − β)/s, 0, 2^k − 1)) + β, learned step s (act_step) "
      "and offset β (act_offset)";
  a.placement = Placement::kAfterRelu;
  a.params = {"act_step", "act_offset"};
  a.attributes = {AttrSpec::needed("activation_bits", AttrType::kInt, "bits per activation (1..8)").range(1, 8),
                  AttrSpec::boolean("relu", false, "stands for a ReLU then the quantizer (no offset)")};
  a.check = [](const Node&) {};
  a.forward = [](const Node& n, const at::Tensor& x, bool) {
    const LsqGrid grid = lsq_unsigned_grid(n.attr_int("activation_bits"));
    const int64_t per_sample = x.dim() > 0 && x.size(0) > 0 ? x.numel() / x.size(0) : x.numel();
    return lsq_quantize(x, lsq_act_step(n), grid, lsq_gradient_scale(per_sample, grid.q_p), 0, offset_of(n));
  };
  a.grid = [](const Node& n) {
    ActivationGrid g;
    g.bits = n.attr_int("activation_bits");
    g.max = lsq_act_step_value(n) * static_cast<double>(lsq_unsigned_grid(g.bits).q_p);
    g.relu = n.attr_bool("relu");
    const at::Tensor b = offset_of(n);
    g.offset = b.defined() ? b.detach().to(at::kCPU, at::kFloat).item<double>() : 0.0;
    return g;
  };
  a.torchscript = [](const Node& n, const std::string& x, const TorchScriptTerms& t) -> std::string {
    const LsqGrid grid = lsq_unsigned_grid(n.attr_int("activation_bits"));
    const std::string s =
        "torch.clamp(" + t.tensor("act_step") + ".reshape([]), min=" + t.number(lsq_step_floor(at::kFloat)) + ")";
    const std::string levels = t.number(static_cast<double>(grid.q_p));
    if (n.attr_bool("relu")) return "torch.round(torch.clamp(" + x + " / " + s + ", 0.0, " + levels + ")) * " + s;
    const std::string b = t.tensor("act_offset") + ".reshape([]).to(" + x + ".dtype)";
    return "torch.round(torch.clamp((" + x + " - " + b + ") / " + s + ", 0.0, " + levels + ")) * " + s + " + " + b;
  };
  a.attach = [](Node& n) {
    const double q_p = static_cast<double>(lsq_unsigned_grid(n.attr_int("activation_bits")).q_p);
    n.params.set("act_step", at::full({1}, 1.0 / std::sqrt(q_p), at::kFloat).set_requires_grad(true));
    if (!n.attr_bool("relu")) n.params.set("act_offset", at::zeros({1}, at::kFloat).set_requires_grad(true));
  };
  // β = min(x) of the batch (so the grid starts at its lowest value), s = 2·mean|x − β|/√Q_P.
  a.initialize = [](const Node& n, const at::Tensor& x) {
    at::NoGradGuard no_grad;
    const LsqGrid grid = lsq_unsigned_grid(n.attr_int("activation_bits"));
    const at::Tensor b = offset_of(n);
    at::Tensor shifted = x.detach().to(at::kFloat);
    if (b.defined()) {
      const at::Tensor lowest = shifted.min().reshape({1});
      b.copy_(lowest);
      shifted = shifted - lowest;
    }
    lsq_act_step(n).copy_(lsq_initial_step(shifted, grid));
  };
  // With a calibrator: β = the smallest value seen, s from the calibrator on the grid from β.
  a.calibrate = [](const Node& n, const Histogram& h, const Calibrator& c, const CalibrationOptions& o) {
    at::NoGradGuard no_grad;
    CalibrationGrid g{0, lsq_unsigned_grid(n.attr_int("activation_bits")).q_p, 0.0};
    const at::Tensor b = offset_of(n);
    const bool with_offset = b.defined() && h.count > 0;
    if (with_offset) g.offset = h.min;
    const double s = std::max(c.step(h, g, o), lsq_step_floor(at::kFloat));  // before anything changes
    if (with_offset) b.fill_(h.min);
    lsq_act_step(n).fill_(s);
  };
  register_activation_quantizer(std::move(a));
  register_quantizer_method(make_lsq_method(
      "lsq_plus", "lsq_plus",
      "LSQ+ (Bhalgat et al. 2020): LSQ with a learned offset for activations that can be negative; W4A4 by default",
      "LSQ+"));
}

}  // namespace whittle::quantize
