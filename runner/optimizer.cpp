#include "runner/optimizer.h"

#include <ATen/ATen.h>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <unordered_map>

#include "core/error.h"

namespace whittle::runner {

namespace {

// A `Kind` optimizer (with options type `Options`) over `groups`, defaults taken from `old`.
template <typename Kind, typename Options>
std::unique_ptr<torch::optim::Optimizer> rebuild_as(const Kind& old,
                                                    const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  return std::make_unique<Kind>(groups, static_cast<const Options&>(old.defaults()));
}

}  // namespace

at::Tensor FusedSGD::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode grad_on(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    bool plain = false;
    for (const auto& p : group.params())
      if (p.grad().defined() && (!p.is_contiguous() || !p.grad().is_contiguous() || p.grad().is_sparse() ||
                                 p.grad().scalar_type() != p.scalar_type()))
        plain = true;
    if (plain) {  // the unfused step of this group alone, on the same state tensors
      std::vector<torch::optim::OptimizerParamGroup> one{torch::optim::OptimizerParamGroup(group.params(), group.options().clone())};
      torch::optim::SGD single(one, o);
      for (const auto& p : group.params())
        if (auto it = state().find(p.unsafeGetTensorImpl()); it != state().end())
          single.state()[p.unsafeGetTensorImpl()] = it->second->clone();
      single.step();
      for (const auto& p : group.params())
        if (auto it = single.state().find(p.unsafeGetTensorImpl()); it != single.state().end())
          state()[p.unsafeGetTensorImpl()] = it->second->clone();
      continue;
    }
    // Parameters with a momentum buffer, and those getting their first (the kernel's
    // is_first_step: buffer = gradient with weight decay, as SGD's clone on the first step).
    std::vector<at::Tensor> params, grads, buffers, first_params, first_grads, first_buffers;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      void* key = p.unsafeGetTensorImpl();
      auto it = state().find(key);
      const bool has_buffer = it != state().end() &&
                              static_cast<const torch::optim::SGDParamState&>(*it->second).momentum_buffer().defined();
      if (o.momentum() == 0 || has_buffer) {
        params.push_back(p);
        grads.push_back(p.grad());
        if (o.momentum() != 0)
          buffers.push_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
      } else {
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(at::empty_like(p));
        first_buffers.push_back(s->momentum_buffer());
        state()[key] = std::move(s);
        first_params.push_back(p);
        first_grads.push_back(p.grad());
      }
    }
    if (!params.empty())
      at::_fused_sgd_(params, grads, buffers, o.weight_decay(), o.momentum(), o.lr(), o.dampening(), o.nesterov(),
                      /*maximize=*/false, /*is_first_step=*/false);
    if (!first_params.empty())
      at::_fused_sgd_(first_params, first_grads, first_buffers, o.weight_decay(), o.momentum(), o.lr(), o.dampening(),
                      o.nesterov(), /*maximize=*/false, /*is_first_step=*/true);
  }
  return loss;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& o, const std::vector<at::Tensor>& params) {
  if (o.name == "sgd" && o.fused) {
    return std::make_unique<FusedSGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay));
  }
  if (o.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay));
  }
  if (o.name == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
  }
  if (o.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
  }
  throw Error("unknown optimizer '" + o.name + "' (sgd, adam, adamw)", ErrorKind::kUsage);
}

std::unique_ptr<torch::optim::Optimizer> rebuild_optimizer(const torch::optim::Optimizer& old,
                                                           const std::vector<at::Tensor>& params) {
  const auto& old_groups = old.param_groups();
  if (old_groups.empty()) throw Error("rebuild_optimizer: the optimizer has no parameter group");
  // Which group held each tensor.
  std::unordered_map<const void*, size_t> group_of;
  for (size_t g = 0; g < old_groups.size(); ++g)
    for (const auto& p : old_groups[g].params()) group_of.emplace(p.unsafeGetTensorImpl(), g);
  std::vector<std::vector<at::Tensor>> members(old_groups.size());
  for (const auto& p : params) {
    auto it = group_of.find(p.unsafeGetTensorImpl());
    members[it == group_of.end() ? 0 : it->second].push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < old_groups.size(); ++g) {
    if (members[g].empty() && !(g == 0 && params.empty())) continue;
    groups.emplace_back(members[g], old_groups[g].options().clone());
  }

  std::unique_ptr<torch::optim::Optimizer> fresh;
  if (const auto* o = dynamic_cast<const FusedSGD*>(&old)) {
    fresh = rebuild_as<FusedSGD, torch::optim::SGDOptions>(*o, groups);
  } else if (const auto* o = dynamic_cast<const torch::optim::SGD*>(&old)) {
    fresh = rebuild_as<torch::optim::SGD, torch::optim::SGDOptions>(*o, groups);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdamW*>(&old)) {
    fresh = rebuild_as<torch::optim::AdamW, torch::optim::AdamWOptions>(*o, groups);
  } else if (const auto* o = dynamic_cast<const torch::optim::Adam*>(&old)) {
    fresh = rebuild_as<torch::optim::Adam, torch::optim::AdamOptions>(*o, groups);
  } else if (const auto* o = dynamic_cast<const torch::optim::RMSprop*>(&old)) {
    fresh = rebuild_as<torch::optim::RMSprop, torch::optim::RMSpropOptions>(*o, groups);
  } else if (const auto* o = dynamic_cast<const torch::optim::Adagrad*>(&old)) {
    fresh = rebuild_as<torch::optim::Adagrad, torch::optim::AdagradOptions>(*o, groups);
  } else {
    throw Error("rebuild_optimizer: unsupported optimizer type (SGD, Adam, AdamW, RMSprop, Adagrad)");
  }
  // Adagrad fills its state at construction; what old held replaces it.
  for (const auto& p : params) {
    void* key = p.unsafeGetTensorImpl();
    auto it = old.state().find(key);
    if (it != old.state().end()) fresh->state()[key] = it->second->clone();
  }
  return fresh;
}

std::vector<at::Tensor> shaped_state_tensors(const torch::optim::OptimizerParamState& state) {
  if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) return {s->momentum_buffer()};
  if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state))
    return {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&state))
    return {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  return {};
}

std::unique_ptr<torch::optim::OptimizerParamState> with_shaped_state_tensors(
    const torch::optim::OptimizerParamState& state, const std::vector<at::Tensor>& t) {
  if (t.size() != shaped_state_tensors(state).size() || t.empty())
    throw Error("with_shaped_state_tensors: " + std::to_string(t.size()) + " tensors for this optimizer state");
  std::unique_ptr<torch::optim::OptimizerParamState> out = state.clone();
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(out.get())) {
    s->momentum_buffer(t[0]);
  } else if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(out.get())) {
    s->exp_avg(t[0]);
    s->exp_avg_sq(t[1]);
    s->max_exp_avg_sq(t[2]);
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(out.get())) {
    s->exp_avg(t[0]);
    s->exp_avg_sq(t[1]);
    s->max_exp_avg_sq(t[2]);
  }
  return out;
}

std::vector<at::Tensor> trainable_parameters(GraphModule& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace whittle::runner
