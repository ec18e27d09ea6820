// Importance criteria: per-channel scores of a dependency group.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "prune/prune.h"

namespace whittle::prune {

const char* criterion_name(Criterion c) {
  switch (c) {
    case Criterion::kL1: return "l1";
    case Criterion::kL2: return "l2";
    case Criterion::kBnScale: return "bn_scale";
    case Criterion::kFpgm: return "fpgm";
    case Criterion::kTaylor: return "taylor";
    case Criterion::kRandom: return "random";
  }
  return "?";
}

Criterion criterion_from_name(const std::string& name) {
  for (Criterion c : {Criterion::kL1, Criterion::kL2, Criterion::kBnScale, Criterion::kFpgm, Criterion::kTaylor,
                      Criterion::kRandom})
    if (name == criterion_name(c)) return c;
  throw Error("unknown pruning criterion '" + name + "' (one of: l1, l2, bn_scale, fpgm, taylor, random)",
              ErrorKind::kUsage);
}

// A hooked weight, held weakly, and the index of its hook in the weight's hook list.
struct TaylorScores::Hook {
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  Hook(WeakImpl w, unsigned i) : weight(std::move(w)), index(i) {}
  WeakImpl weight;
  unsigned index;
};

TaylorScores::~TaylorScores() { detach(); }

void TaylorScores::detach() {
  for (const auto& h : hooks_) {
    // A weight still alive loses its hook; a freed one took its hook with it.
    const at::Tensor weight(h->weight.lock());
    if (weight.defined()) weight.remove_hook(h->index);
  }
  hooks_.clear();
}

void TaylorScores::attach(GraphModule& module) {
  detach();
  for (Node& n : module->graph().nodes()) {
    at::Tensor* w = n.params.find("weight");
    if (!w || !w->defined() || !w->requires_grad()) continue;
    const std::string key = n.name + ".weight";
    auto sums = sums_;
    // The hook lives in the weight's autograd metadata: a strong reference to the weight in it
    // would be a cycle that keeps the weight (and its gradient) alive forever.
    const Hook::WeakImpl weak(w->getIntrusivePtr());
    const unsigned index = w->register_hook([sums, key, weak](const at::Tensor& grad) {
      const at::Tensor weight(weak.lock());
      if (!weight.defined()) return;
      at::NoGradGuard g;
      at::Tensor term = (weight.detach() * grad).abs();
      auto it = sums->find(key);
      if (it == sums->end() || !it->second.sizes().equals(term.sizes())) (*sums)[key] = term.clone();
      else it->second.add_(term);
    });
    hooks_.push_back(std::make_shared<Hook>(weak, index));
  }
}

void TaylorScores::reset() { sums_->clear(); }

namespace {

// The sums of `t` per position of a member's side of `size` positions, over every other axis:
// [size] doubles. A per-group axis (axis 1 holding size / groups entries, the groups split along
// axis 0, as in a grouped conv2d's input axis or a conv_transpose2d's output axis) gives global
// position g·(size / groups) + j the sum over group g's slice at entry j only.
at::Tensor per_position(const at::Tensor& t, int64_t axis, int64_t size, int64_t groups) {
  at::Tensor x = t.detach().to(at::kCPU, at::kDouble);
  if (x.size(axis) == size) {
    at::Tensor moved = x.movedim(axis, 0);
    return moved.reshape({moved.size(0), -1}).sum(1).contiguous();
  }
  if (axis == 1 && groups > 1 && x.size(1) * groups == size && x.size(0) % groups == 0)
    return x.reshape({groups, x.size(0) / groups, x.size(1), -1}).sum({1, 3}).reshape({size}).contiguous();
  throw Error("pruning: a tensor axis of " + std::to_string(x.size(axis)) + " entries does not match " +
              std::to_string(size) + " channel positions");
}

// The member's tensor `name` (a parameter, or a buffer), undefined when absent.
at::Tensor member_tensor(const Node& n, const std::string& name) {
  if (const at::Tensor* t = n.params.find(name)) return *t;
  if (const at::Tensor* t = n.buffers.find(name)) return *t;
  return {};
}

double position_sum(const at::Tensor& per, const std::vector<int64_t>& positions) {
  const double* v = per.data_ptr<double>();
  double s = 0;
  for (int64_t p : positions) s += v[p];
  return s;
}

}  // namespace

std::vector<double> score(const Graph& graph, const DependencyGroup& group, const ScoreOptions& o) {
  const size_t channels = static_cast<size_t>(group.channels);
  std::vector<double> total(channels, 0.0);
  std::vector<int> contributions(channels, 0);
  const double inf = std::numeric_limits<double>::infinity();

  if (o.criterion == Criterion::kRandom) {
    std::mt19937_64 rng(o.seed * 1000003ULL + static_cast<uint64_t>(group.id));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (auto& s : total) s = u(rng);
  } else if (o.criterion == Criterion::kFpgm) {
    // Producers' filters: w_c flattened; score Σ_j ‖w_c − w_j‖₂ (small: close to the geometric median).
    for (const Member& m : group.members) {
      if (m.role != ChannelRole::kOutput) continue;
      const Node& n = graph.node(m.node);
      const std::optional<int64_t> axis = weight_output_axis(n);
      at::Tensor w = n.params.contains("weight") ? n.params.at("weight") : at::Tensor();
      if (!axis || !w.defined()) continue;
      at::Tensor rows = w.detach().to(at::kCPU, at::kDouble).movedim(*axis, 0);
      rows = rows.reshape({rows.size(0), -1});
      at::Tensor dist = at::cdist(rows.unsqueeze(0), rows.unsqueeze(0)).squeeze(0).sum(1);
      if (dist.size(0) != m.size) continue;  // a per-group output axis: not ranked by this member
      for (size_t k = 0; k < channels; ++k) {
        if (m.positions[k].empty()) continue;
        total[k] += position_sum(dist.contiguous(), m.positions[k]);
        ++contributions[k];
      }
    }
  } else {
    for (const Member& m : group.members) {
      const Node& n = graph.node(m.node);
      const int64_t groups = channel_groups(n);
      for (const auto& [name, axis] : m.tensors) {
        if (o.criterion == Criterion::kBnScale) {
          // |γ| of the normalization (the registry's norm_scale: a batch_norm's weight, or the
          // bn_weight of a layer QAT has folded its BN into).
          if (name != norm_scale_param(n)) continue;
        } else if (name != "weight") {
          continue;  // weights (and BN γ) only: biases and statistics do not rank
        }
        at::Tensor t = member_tensor(n, name);
        if (!t.defined()) continue;
        at::Tensor per;
        switch (o.criterion) {
          case Criterion::kL1:
          case Criterion::kBnScale: per = per_position(t.abs(), axis, m.size, groups); break;
          case Criterion::kL2: per = per_position(t.pow(2), axis, m.size, groups); break;
          case Criterion::kTaylor: {
            if (!o.taylor) throw Error("pruning criterion 'taylor' needs accumulated gradient scores (TaylorScores)");
            auto it = o.taylor->sums().find(m.node + "." + name);
            if (it == o.taylor->sums().end()) continue;
            per = per_position(it->second, axis, m.size, groups);
            break;
          }
          default: continue;
        }
        for (size_t k = 0; k < channels; ++k) {
          if (m.positions[k].empty()) continue;
          total[k] += position_sum(per, m.positions[k]);
          ++contributions[k];
        }
      }
    }
    if (o.criterion == Criterion::kBnScale)
      for (size_t k = 0; k < channels; ++k)
        if (contributions[k] == 0) total[k] = inf;  // no BN: network slimming does not rank it
  }
  if (o.mean_over_members)
    for (size_t k = 0; k < channels; ++k)
      if (contributions[k] > 0) total[k] /= contributions[k];
  for (size_t k = 0; k < channels; ++k)
    if (group.fixed[k]) total[k] = inf;
  return total;
}

}  // namespace whittle::prune
