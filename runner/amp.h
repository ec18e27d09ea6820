#pragma once
// Automatic mixed precision on CUDA (`training.amp`): autocast around the forward pass, and
// dynamic loss scaling for fp16 (as torch.cuda.amp.GradScaler with its default constants).

#include <ATen/Tensor.h>
#include <ATen/TensorOperators.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace whittle::runner {

/// Dynamic loss scaling for fp16 autocast: the loss is multiplied by scale() before backward;
/// unscale_and_check() divides the gradients by it and reports whether they are all finite. A step
/// with non-finite gradients is skipped and halves the scale; 2000 finite steps in a row double it.
/// Disabled, it leaves losses and gradients alone and every step is taken.
class LossScaler {
 public:
  static constexpr double kInitialScale = 65536.0;  ///< 2^16
  static constexpr int64_t kGrowthInterval = 2000;  ///< finite steps before the scale doubles

  explicit LossScaler(bool enabled = false) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }
  /// Finite steps since the scale last changed.
  int64_t clean_steps() const { return clean_steps_; }
  /// Restores scale() and clean_steps() (training-state resume).
  void restore(double scale, int64_t clean_steps) {
    scale_ = scale;
    clean_steps_ = clean_steps;
  }
  /// `loss`·scale() when enabled, else `loss`.
  at::Tensor scale_loss(const at::Tensor& loss) const { return enabled_ ? loss * scale_ : loss; }
  /// Divides the gradients of `params` (those defined) by scale() and updates the scale; returns
  /// whether every gradient is finite (true when disabled: nothing is touched).
  bool unscale_and_check(const std::vector<at::Tensor>& params);

 private:
  bool enabled_;
  double scale_ = kInitialScale;
  int64_t clean_steps_ = 0;
};

/// CUDA autocast to `dtype` (at::kHalf or at::kBFloat16) for the lifetime of the object when
/// `enabled`; on destruction autocast is turned off and its cast cache cleared. Does nothing when
/// not enabled.
class AutocastScope {
 public:
  AutocastScope(bool enabled, at::ScalarType dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
};

}  // namespace whittle::runner
