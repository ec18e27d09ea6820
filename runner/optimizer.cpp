#include "runner/optimizer.h"

#include <ATen/ATen.h>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "graph/op_registry.h"

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

WeightDecayOverrides weight_decay_overrides(const std::vector<GraphModule>& modules, const OptimizerSpec& spec) {
  WeightDecayOverrides out;
  const double norm = spec.norm_weight_decay.value_or(spec.weight_decay);
  const double bias = spec.bias_weight_decay.value_or(spec.weight_decay);
  for (const GraphModule& module : modules)
    for (const Node& node : module->graph().nodes())
      for (const auto& [name, tensor] : node.params) {
        if (!tensor.defined()) continue;
        // The registry says what each parameter is; a quantizer's learned step or clip gets no decay.
        double decay = spec.weight_decay;
        switch (param_role(node, name)) {
          case ParamRole::kNorm: decay = norm; break;
          case ParamRole::kBias: decay = bias; break;
          case ParamRole::kQuantizer: decay = 0.0; break;
          case ParamRole::kWeight: break;
        }
        if (decay != spec.weight_decay) out.emplace(tensor.unsafeGetTensorImpl(), decay);
      }
  return out;
}

namespace {

// The parameter groups of make_optimizer: `params` with `spec.weight_decay` first, then one group
// per other decay in `overrides`, in order of first appearance; empty groups are left out.
std::vector<std::pair<double, std::vector<at::Tensor>>> decay_groups(double weight_decay,
                                                                     const std::vector<at::Tensor>& params,
                                                                     const WeightDecayOverrides& overrides) {
  std::vector<std::pair<double, std::vector<at::Tensor>>> groups{{weight_decay, {}}};
  for (const auto& p : params) {
    auto it = overrides.find(p.unsafeGetTensorImpl());
    const double decay = it == overrides.end() ? weight_decay : it->second;
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == decay; });
    if (g == groups.end()) g = groups.insert(groups.end(), {decay, {}});
    g->second.push_back(p);
  }
  if (groups.size() > 1 && groups.front().second.empty()) groups.erase(groups.begin());
  return groups;
}

// An optimizer of type Kind over `params`, one group per weight decay (decay_groups).
template <typename Kind, typename Options>
std::unique_ptr<torch::optim::Optimizer> make_grouped(const Options& options, const std::vector<at::Tensor>& params,
                                                      const WeightDecayOverrides& overrides) {
  if (overrides.empty()) return std::make_unique<Kind>(params, options);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (auto& [decay, members] : decay_groups(options.weight_decay(), params, overrides)) {
    auto o = std::make_unique<Options>(options);
    o->weight_decay(decay);
    groups.emplace_back(members, std::move(o));
  }
  return std::make_unique<Kind>(groups, options);
}

// `o` (cloned) with weight decay `decay`.
std::unique_ptr<torch::optim::OptimizerOptions> with_weight_decay(const torch::optim::OptimizerOptions& o, double decay) {
  std::unique_ptr<torch::optim::OptimizerOptions> out = o.clone();
  if (auto* x = dynamic_cast<torch::optim::SGDOptions*>(out.get())) x->weight_decay(decay);
  else if (auto* x = dynamic_cast<torch::optim::AdamWOptions*>(out.get())) x->weight_decay(decay);
  else if (auto* x = dynamic_cast<torch::optim::AdamOptions*>(out.get())) x->weight_decay(decay);
  else if (auto* x = dynamic_cast<torch::optim::RMSpropOptions*>(out.get())) x->weight_decay(decay);
  else if (auto* x = dynamic_cast<torch::optim::AdagradOptions*>(out.get())) x->weight_decay(decay);
  else throw Error("rebuild_optimizer: unsupported optimizer options (SGD, Adam, AdamW, RMSprop, Adagrad)");
  return out;
}

}  // namespace

std::optional<double> weight_decay_of(const torch::optim::OptimizerOptions& o) {
  if (const auto* x = dynamic_cast<const torch::optim::SGDOptions*>(&o)) return x->weight_decay();
  if (const auto* x = dynamic_cast<const torch::optim::AdamWOptions*>(&o)) return x->weight_decay();
  if (const auto* x = dynamic_cast<const torch::optim::AdamOptions*>(&o)) return x->weight_decay();
  if (const auto* x = dynamic_cast<const torch::optim::RMSpropOptions*>(&o)) return x->weight_decay();
  if (const auto* x = dynamic_cast<const torch::optim::AdagradOptions*>(&o)) return x->weight_decay();
  return std::nullopt;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& o, const std::vector<at::Tensor>& params,
                                                        const WeightDecayOverrides& overrides) {
  if (o.name == "sgd") {
    const auto options =
        torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay);
    return o.fused ? make_grouped<FusedSGD>(options, params, overrides)
                   : make_grouped<torch::optim::SGD>(options, params, overrides);
  }
  if (o.name == "adam") {
    return make_grouped<torch::optim::Adam>(
        torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay), params,
        overrides);
  }
  if (o.name == "adamw") {
    return make_grouped<torch::optim::AdamW>(
        torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay), params,
        overrides);
  }
  throw Error("unknown optimizer '" + o.name + "' (sgd, adam, adamw)", ErrorKind::kUsage);
}

std::unique_ptr<torch::optim::Optimizer> rebuild_optimizer(const torch::optim::Optimizer& old,
                                                           const std::vector<at::Tensor>& params,
                                                           const WeightDecayOverrides& overrides,
                                                           std::optional<double> weight_decay) {
  const auto& old_groups = old.param_groups();
  if (old_groups.empty()) throw Error("rebuild_optimizer: the optimizer has no parameter group");
  // Which group held each tensor.
  std::unordered_map<const void*, size_t> group_of;
  for (size_t g = 0; g < old_groups.size(); ++g)
    for (const auto& p : old_groups[g].params()) group_of.emplace(p.unsafeGetTensorImpl(), g);
  // A new parameter with a decay of its own joins the first group with that decay, or a new one.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  for (const auto& g : old_groups) options.push_back(g.options().clone());
  std::vector<std::vector<at::Tensor>> members(old_groups.size());
  for (const auto& p : params) {
    if (auto it = group_of.find(p.unsafeGetTensorImpl()); it != group_of.end()) {
      members[it->second].push_back(p);
      continue;
    }
    std::optional<double> decay = weight_decay;
    if (auto d = overrides.find(p.unsafeGetTensorImpl()); d != overrides.end()) decay = d->second;
    size_t g = 0;
    if (decay) {
      while (g < options.size() && weight_decay_of(*options[g]) != decay) ++g;
      if (g == options.size()) {
        options.push_back(with_weight_decay(*options[0], *decay));
        members.emplace_back();
      }
    }
    members[g].push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < options.size(); ++g) {
    if (members[g].empty() && !(g == 0 && params.empty())) continue;
    groups.emplace_back(members[g], std::move(options[g]));
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
