#include "runner/amp.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>

namespace whittle::runner {

bool LossScaler::unscale_and_check(const std::vector<at::Tensor>& params) {
  if (!enabled_) return true;
  bool finite = true;
  at::NoGradGuard g;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    p.grad().mul_(1.0 / scale_);
    if (!at::isfinite(p.grad()).all().item<bool>()) finite = false;
  }
  if (!finite) {
    scale_ /= 2;
    clean_steps_ = 0;
  } else if (++clean_steps_ >= kGrowthInterval) {
    scale_ *= 2;
    clean_steps_ = 0;
  }
  return finite;
}

AutocastScope::AutocastScope(bool enabled, at::ScalarType dtype) : enabled_(enabled) {
  if (!enabled_) return;
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
}

}  // namespace whittle::runner
