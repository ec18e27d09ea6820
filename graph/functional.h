#pragma once
// Op math shared by several registry entries (the built-in ops and the ops of compression
// modules that wrap them), so that each rule is written once.

#include <ATen/Tensor.h>

namespace whittle {

/// Batch normalization over dim 1 as torch.nn.BatchNorm1d/2d computes it. x: [N, C, ...];
/// weight, bias (may be undefined), running_mean, running_var: [C]. In training the batch
/// statistics normalize and the running statistics move by `momentum`; `num_batches_tracked`
/// (int64 scalar, may be nullptr) is incremented first, and a momentum < 0 means the cumulative
/// average 1/num_batches_tracked (PyTorch's momentum=None). In eval the running statistics
/// normalize. `eps` is added to the variance.
at::Tensor batch_norm_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const at::Tensor& running_mean, const at::Tensor& running_var,
                              const at::Tensor* num_batches_tracked, bool training, double momentum, double eps);

}  // namespace whittle
