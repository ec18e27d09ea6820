#include "graph/functional.h"

#include <ATen/ATen.h>

namespace whittle {

at::Tensor batch_norm_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const at::Tensor& running_mean, const at::Tensor& running_var,
                              const at::Tensor* num_batches_tracked, bool training, double momentum, double eps) {
  if (training && num_batches_tracked && num_batches_tracked->defined()) {
    at::NoGradGuard no_grad;
    const_cast<at::Tensor*>(num_batches_tracked)->add_(1);
    if (momentum < 0) momentum = 1.0 / static_cast<double>(num_batches_tracked->item<int64_t>());
  } else if (momentum < 0) {
    momentum = 0.0;
  }
  return at::batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, true);
}

}  // namespace whittle
