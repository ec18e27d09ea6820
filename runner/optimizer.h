#pragma once
// The optimizer of `training.optimizer`, and its rebuild when a modifier changes the parameter set.

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "graph/graph_module.h"
#include "runner/recipe.h"

namespace whittle::runner {

/// torch::optim::SGD whose step() runs ATen's fused SGD kernel (at::_fused_sgd_, the kernel of
/// PyTorch's `SGD(fused=True)`): one pass over each parameter doing weight decay, momentum, Nesterov
/// and the update, in place of SGD's chain of ATen ops per parameter. The same update rule
/// (Sutskever et al., 2013, as torch.optim.SGD), equal to SGD's up to float rounding; options,
/// state (one momentum_buffer per parameter), serialization and rebuild_optimizer are SGD's.
/// Falls back to SGD::step() for a group with a non-contiguous or sparse parameter or gradient.
class FusedSGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  at::Tensor step(LossClosure closure = nullptr) override;
};

/// The weight decay of each parameter that does not take `OptimizerSpec::weight_decay`, keyed by
/// TensorImpl* (the key LibTorch's optimizers use).
using WeightDecayOverrides = std::unordered_map<const void*, double>;

/// The parameters of `modules` whose weight decay `spec` sets apart from `spec.weight_decay`:
/// `norm_weight_decay` for a normalization's γ and β (the registry's OpTraits::norm_params: batch
/// norm, the BN half of a QAT conv_bn_qat), `bias_weight_decay` for the other parameters named
/// `bias`. Empty when neither is set or both equal weight_decay. The usual exemption of γ, β and
/// biases from L2 (Goyal et al., 2017, arXiv:1706.02677 §5; He et al., 2019, "Bag of Tricks",
/// §3.1), as torchvision's `norm_weight_decay` and `bias_weight_decay`. Throws whittle::Error for a
/// node whose op is not registered.
WeightDecayOverrides weight_decay_overrides(const std::vector<GraphModule>& modules, const OptimizerSpec& spec);

/// The weight decay of an optimizer group's options (SGD, Adam, AdamW, RMSprop, Adagrad); nullopt
/// for another optimizer.
std::optional<double> weight_decay_of(const torch::optim::OptimizerOptions& options);

/// A new optimizer as `spec` names it (torch::optim::SGD, FusedSGD when `spec.fused`, Adam or
/// AdamW with its hyper-parameters) over `params`. One parameter group with `spec.weight_decay`,
/// then one group for each other weight decay in `overrides` (in order of first appearance in
/// `params`), the same options but that decay; a group left empty is not made. Throws
/// whittle::Error (usage) for another name.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<at::Tensor>& params,
                                                        const WeightDecayOverrides& overrides = {});

/// The same kind of optimizer as `old` (SGD, Adam, AdamW, RMSprop or Adagrad) over `params`, with
/// old's hyper-parameters as they are now (defaults and each group's options, the current
/// learning rate included) and the per-parameter state (SGD momentum_buffer; Adam/AdamW step,
/// exp_avg, exp_avg_sq, max_exp_avg_sq; ...) of every tensor of `params` that `old` held: the
/// same tensor object (LibTorch keys Optimizer::state() by TensorImpl*), not a copy with equal
/// values. A parameter old held stays in its group. A new one takes its decay in `overrides`, or
/// else `weight_decay` (when given; otherwise it joins the first group), and joins the first group
/// with that decay, or a new group with the first group's options and that decay. Groups left
/// empty are dropped. Parameters old held that are not in `params` lose their state. The state is
/// shared with old (the tensors are not copied), so `old` should be discarded. Throws
/// whittle::Error for another optimizer type.
std::unique_ptr<torch::optim::Optimizer> rebuild_optimizer(const torch::optim::Optimizer& old,
                                                           const std::vector<at::Tensor>& params,
                                                           const WeightDecayOverrides& overrides = {},
                                                           std::optional<double> weight_decay = std::nullopt);

/// The tensors of one parameter's optimizer state that have the parameter's shape, in a fixed
/// order per optimizer type: SGD {momentum_buffer}; Adam and AdamW {exp_avg, exp_avg_sq,
/// max_exp_avg_sq} (undefined ones included, as they are). Empty for other types (RMSprop,
/// Adagrad): their state is not carried through a change of shape.
std::vector<at::Tensor> shaped_state_tensors(const torch::optim::OptimizerParamState& state);
/// A copy of `state` (same type, the same step count) holding `tensors` in place of
/// shaped_state_tensors(state), in that order: the state of a parameter whose channels were
/// sliced, with its moments sliced alike. Throws whittle::Error for a count that does not fit.
std::unique_ptr<torch::optim::OptimizerParamState> with_shaped_state_tensors(
    const torch::optim::OptimizerParamState& state, const std::vector<at::Tensor>& tensors);

/// The parameters of `model` that require gradients, in registration order (what the trainer
/// optimizes).
std::vector<at::Tensor> trainable_parameters(GraphModule& model);

/// Sets the learning rate of every parameter group of `optimizer` to `lr`.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace whittle::runner
