#pragma once
// Op math shared by several registry entries (the built-in ops and the ops of compression
// modules that wrap them), so that each rule is written once.

#include <ATen/Tensor.h>

#include <functional>
#include <memory>

namespace whittle {

/// Batch normalization over dim 1 as torch.nn.BatchNorm1d/2d computes it. x: [N, C, ...];
/// weight, bias (may be undefined), running_mean, running_var: [C]. In training the batch
/// statistics normalize and the running statistics move by `momentum`; `num_batches_tracked`
/// (int64 scalar, may be nullptr) is incremented first, and a momentum < 0 means the cumulative
/// average 1/num_batches_tracked (PyTorch's momentum=None). In eval the running statistics
/// normalize. `eps` is added to the variance. Inside a CrossReplicaBatchNorm scope, training
/// batch statistics are those of the whole data-parallel batch (see there).
at::Tensor batch_norm_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const at::Tensor& running_mean, const at::Tensor& running_var,
                              const at::Tensor* num_batches_tracked, bool training, double momentum, double eps);

/// Sums a tensor in place over the replicas of a data-parallel job (every replica calls it with the
/// same shape, in the same order). runner/distributed.h makes one from a ProcessGroup.
using ReplicaSum = std::function<void(at::Tensor& values)>;

/// Synchronized batch normalization (torch.nn.SyncBatchNorm) for the training forward passes run
/// on this thread while the scope lives: batch_norm_forward takes the mean and the biased variance
/// over the union of every replica's batch (per channel, from summed counts, sums and sums of
/// squares, in float64), normalizes with them, moves the running statistics by them (the variance
/// unbiased over the global count), and in the backward pass sums the per-channel Σdy and Σdy·x̂
/// across replicas, so that the input gradients are those of the global batch. The weight and
/// bias gradients stay local (data parallelism averages them). Every replica must run the same
/// batch norms in the same order. Scopes nest (the innermost applies); `sum` must stay callable
/// until the backward passes of those forwards are done.
class CrossReplicaBatchNorm {
 public:
  explicit CrossReplicaBatchNorm(ReplicaSum sum);
  ~CrossReplicaBatchNorm();
  CrossReplicaBatchNorm(const CrossReplicaBatchNorm&) = delete;
  CrossReplicaBatchNorm& operator=(const CrossReplicaBatchNorm&) = delete;

 private:
  std::shared_ptr<const ReplicaSum> previous_;
};

}  // namespace whittle
