#include "graph/functional.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/error.h"
#include "graph/graph.h"

namespace whittle {

at::Tensor batch_norm_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const at::Tensor& running_mean, const at::Tensor& running_var,
                              const at::Tensor* num_batches_tracked, bool training, double momentum, double eps) {
  if (training && x.dim() >= 2 && x.numel() / std::max<int64_t>(x.size(1), 1) <= 1)
    // As torch.nn.functional.batch_norm: one value per channel has no variance (a batch of one
    // image into a BN over features).
    throw Error("batch statistics need more than 1 value per channel, got input of shape " + shape_str(x.sizes().vec()) +
                " (a training batch of 1 image: data.batch_size, or the last batch with data.drop_last false)");
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
