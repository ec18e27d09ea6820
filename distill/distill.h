#pragma once
// whittle::distill: knowledge distillation (docs/distillation.md). Losses between a student's and
// a frozen teacher's logits or features, a frozen Teacher, and the hint adapter of FitNets. The
// recipe modifier `distill` (runner/distill_modifier.h) schedules them in training; a user's own
// loop calls them directly:
//
//   whittle::distill::Teacher teacher(whittle::export_::load_checkpoint("fp32.h5").graph);
//   at::Tensor t = teacher.forward(x);                              // no grad, eval, frozen
//   at::Tensor loss = whittle::distill::kd_mixed_loss(student->forward(x), t, y, 4.0, 0.9);

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/graph_module.h"

namespace whittle::distill {

/// Knowledge distillation loss (Hinton, Vinyals & Dean 2015): T²·KL(softmax(t/T) ‖ softmax(s/T)),
/// the KL divergence summed over classes and averaged over the samples (the true KL per sample,
/// batch mean). The T² keeps the soft gradient's scale about independent of T.
/// `student_logits`, `teacher_logits`: [N, K] (the teacher's are treated as constants).
/// Throws whittle::Error (usage) for shapes that differ or are not [N, K], or T ≤ 0.
at::Tensor kd_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits, double temperature);

/// α·kd_loss(s, t, T) + (1 − α)·cross_entropy(s, target) (batch mean); `target` [N] class indices.
/// Throws like kd_loss, and for α outside [0, 1].
at::Tensor kd_mixed_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits, const at::Tensor& target,
                         double temperature, double alpha);

/// The spatial attention map of Zagoruyko & Komodakis 2017: Q = Σ_c |A_c|^p over the channels of
/// `features` [N, C, H, W], flattened to [N, H·W] and divided by its L2 norm per sample (a map of
/// zeros stays zero). Throws whittle::Error (usage) for a tensor that is not 4-D, or p ≤ 0.
at::Tensor attention_map(const at::Tensor& features, double p = 2.0);

/// Attention transfer loss (Zagoruyko & Komodakis 2017): β/2·‖Q_s/‖Q_s‖₂ − Q_t/‖Q_t‖₂‖₂ with the
/// maps of attention_map(·, p), the L2 norm of the difference per sample averaged over the batch.
/// Student and teacher may differ in channels, not in N, H, W: throws whittle::Error (usage) naming
/// both shapes (prefixed by `where`, e.g. "pair layer2.relu → layer3.relu") otherwise.
at::Tensor attention_loss(const at::Tensor& student_features, const at::Tensor& teacher_features, double beta = 2.0,
                          double p = 2.0, const std::string& where = "");

/// FitNets hint loss (Romero et al. 2015): the mean squared error over every element between the
/// adapted student feature and the teacher's (same shape [N, C, H, W]; throws whittle::Error
/// (usage) naming both shapes, prefixed by `where`, otherwise).
at::Tensor hint_loss(const at::Tensor& adapted_student, const at::Tensor& teacher_features, const std::string& where = "");

/// The learned regressor of a FitNets hint: a 1×1 convolution from the student's channels to the
/// teacher's (no bias) followed by batch norm, as a GraphModule whose parameters the caller adds
/// to its optimizer, taking student features of `student_shape` [N, C_s, H, W] (any N) to
/// [N, teacher_channels, H, W]. Initialized as torch.nn does (seeded when `seed` is given).
/// Throws whittle::Error (usage) for a shape that is not 4-D or a channel count below 1.
GraphModule hint_adapter(const Shape& student_shape, int64_t teacher_channels, std::optional<uint64_t> seed = std::nullopt);

/// A frozen teacher: its graph in eval mode, every parameter with requires_grad false, run under
/// no-grad. forward() never changes its BN statistics or draws dropout masks, whatever mode the
/// caller's student is in.
class Teacher {
 public:
  /// Freezes `graph`'s tensors (detached copies; the graph passed in is not shared).
  explicit Teacher(Graph graph);
  /// The teacher's outputs (its first graph output, e.g. logits [N, K]) for input `x` (moved to the
  /// teacher's device), and, for each name in `capture` (graph value names), that value in
  /// `features`. Throws whittle::Error naming an unknown value.
  at::Tensor forward(const at::Tensor& x, const std::vector<std::string>& capture = {},
                     std::map<std::string, at::Tensor>* features = nullptr);
  /// Moves the teacher (e.g. to the student's device).
  void to(at::Device device);
  const Graph& graph() const { return module_->graph(); }
  GraphModule& module() { return module_; }

 private:
  GraphModule module_;
  at::Device device_ = at::kCPU;  // where the teacher's tensors are (to())
};

}  // namespace whittle::distill
