#include "graph/functional.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "core/error.h"
#include "graph/graph.h"

namespace whittle {

namespace {

thread_local std::shared_ptr<const ReplicaSum> t_replica_sum;

// Holds the replica sum for the backward pass (saved in the autograd context).
// What the autograd function carries besides its differentiable inputs: the replica sum (kept for
// the backward pass) and the running statistics it updates.
struct ReplicaSumHolder : torch::CustomClassHolder {
  std::shared_ptr<const ReplicaSum> sum;
  at::Tensor running_mean, running_var;
};

std::vector<int64_t> reduced_dims(const at::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// [C] → broadcastable against x [N, C, ...].
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

// Batch norm over every replica's batch; the statistics as torch.nn.SyncBatchNorm computes them.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double momentum, double eps,
                            c10::intrusive_ptr<ReplicaSumHolder> holder) {
    at::Tensor& running_mean = holder->running_mean;
    at::Tensor& running_var = holder->running_var;
    const std::vector<int64_t> dims = reduced_dims(x);
    const int64_t c = x.size(1);
    const at::Tensor xs = x.is_floating_point() && x.element_size() < 4 ? x.to(at::kFloat) : x;  // x² of fp16 overflows
    at::Tensor stats = at::cat({at::sum(xs, dims, false, at::kDouble), at::sum(xs * xs, dims, false, at::kDouble),
                                at::full({1}, static_cast<double>(x.numel() / c), x.options().dtype(at::kDouble))});
    (*holder->sum)(stats);
    const double count = stats[2 * c].item<double>();
    const at::Tensor mean = stats.slice(0, 0, c) / count;
    const at::Tensor var = (stats.slice(0, c, 2 * c) / count - mean * mean).clamp_min(0);
    const at::Tensor invstd = (var + eps).rsqrt().to(x.scalar_type());
    const at::Tensor xhat = (x - per_channel(mean.to(x.scalar_type()), x)) * per_channel(invstd, x);
    at::Tensor y = xhat;
    if (weight.defined()) y = y * per_channel(weight, x);
    if (bias.defined()) y = y + per_channel(bias, x);
    {
      at::NoGradGuard no_grad;
      if (running_mean.defined()) running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      if (running_var.defined())
        running_var.mul_(1 - momentum).add_((var * (count / std::max(count - 1, 1.0))).to(running_var.scalar_type()), momentum);
    }
    ctx->save_for_backward({xhat, invstd, weight});
    ctx->saved_data["count"] = count;
    ctx->saved_data["sum"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["has_weight"] = weight.defined();
    ctx->saved_data["has_bias"] = bias.defined();
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& xhat = saved[0];
    const at::Tensor& invstd = saved[1];
    const at::Tensor& weight = saved[2];
    const double count = ctx->saved_data["count"].toDouble();
    auto holder = c10::static_intrusive_pointer_cast<ReplicaSumHolder>(ctx->saved_data["sum"].toCapsule());
    const at::Tensor dy = grads[0];
    const std::vector<int64_t> dims = reduced_dims(xhat);
    const int64_t c = xhat.size(1);
    const at::Tensor sum_dy = dy.sum(dims);
    const at::Tensor sum_dy_xhat = (dy * xhat).sum(dims);
    at::Tensor global = at::cat({sum_dy, sum_dy_xhat});
    (*holder->sum)(global);
    at::Tensor scale = invstd;
    if (weight.defined()) scale = scale * weight;
    const at::Tensor dx = per_channel(scale, xhat) * (dy - per_channel(global.slice(0, 0, c) / count, xhat) -
                                                      xhat * per_channel(global.slice(0, c, 2 * c) / count, xhat));
    return {dx, ctx->saved_data["has_weight"].toBool() ? sum_dy_xhat : at::Tensor(),
            ctx->saved_data["has_bias"].toBool() ? sum_dy : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor sync_batch_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var, double momentum, double eps,
                           const std::shared_ptr<const ReplicaSum>& sum) {
  auto holder = c10::make_intrusive<ReplicaSumHolder>();
  holder->sum = sum;
  holder->running_mean = running_mean;
  holder->running_var = running_var;
  return SyncBatchNormFunction::apply(x, weight, bias, momentum, eps, holder);
}

}  // namespace

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
  if (training && t_replica_sum) return sync_batch_norm(x, weight, bias, running_mean, running_var, momentum, eps, t_replica_sum);
  return at::batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, true);
}

CrossReplicaBatchNorm::CrossReplicaBatchNorm(ReplicaSum sum) : previous_(t_replica_sum) {
  t_replica_sum = std::make_shared<const ReplicaSum>(std::move(sum));
}

CrossReplicaBatchNorm::~CrossReplicaBatchNorm() { t_replica_sum = previous_; }

}  // namespace whittle
