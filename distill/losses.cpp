// Distillation losses: KD, attention transfer, FitNets hints (distill.h).

#include <ATen/ATen.h>

#include "core/error.h"
#include "distill/distill.h"
#include "graph/graph_builder.h"

namespace whittle::distill {

namespace {

std::string prefix(const std::string& where) { return where.empty() ? "" : where + ": "; }

void check_same_shape(const at::Tensor& a, const at::Tensor& b, const char* what, const std::string& where) {
  if (!a.sizes().equals(b.sizes()))
    throw Error(prefix(where) + what + ": the student's " + shape_str(a.sizes().vec()) + " and the teacher's " +
                    shape_str(b.sizes().vec()) + " differ",
                ErrorKind::kUsage);
}

}  // namespace

at::Tensor kd_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits, double temperature) {
  if (!(temperature > 0)) throw Error("kd_loss: the temperature must be > 0, got " + std::to_string(temperature), ErrorKind::kUsage);
  if (student_logits.dim() != 2) throw Error("kd_loss: logits must be [N, K], got " + shape_str(student_logits.sizes().vec()), ErrorKind::kUsage);
  check_same_shape(student_logits, teacher_logits, "kd_loss logits", "");
  const at::Tensor log_p_s = at::log_softmax(student_logits.to(at::kFloat) / temperature, 1);
  const at::Tensor log_p_t = at::log_softmax(teacher_logits.detach().to(at::kFloat) / temperature, 1);
  // KL(p_t ‖ p_s) = Σ_k p_t (log p_t − log p_s), summed over classes, averaged over samples. A
  // class the teacher gives probability 0 (a −inf logit) adds its limit 0, even where the student
  // also has −inf (−inf − (−inf) would be NaN); no gradient flows through the teacher.
  const at::Tensor p_t = log_p_t.exp();
  const at::Tensor kl = at::where(p_t > 0, p_t * (log_p_t - log_p_s), at::zeros({}, p_t.options())).sum(1).mean();
  return kl * (temperature * temperature);
}

at::Tensor kd_mixed_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits, const at::Tensor& target,
                         double temperature, double alpha) {
  if (!(alpha >= 0 && alpha <= 1)) throw Error("kd_mixed_loss: alpha must be in [0, 1], got " + std::to_string(alpha), ErrorKind::kUsage);
  const at::Tensor ce = at::cross_entropy_loss(student_logits.to(at::kFloat), target);
  return alpha * kd_loss(student_logits, teacher_logits, temperature) + (1 - alpha) * ce;
}

at::Tensor attention_map(const at::Tensor& features, double p) {
  if (features.dim() != 4) throw Error("attention_map: features must be [N, C, H, W], got " + shape_str(features.sizes().vec()), ErrorKind::kUsage);
  if (!(p > 0)) throw Error("attention_map: p must be > 0", ErrorKind::kUsage);
  const at::Tensor q = features.to(at::kFloat).abs().pow(p).sum(1).flatten(1);  // [N, H·W]
  const at::Tensor norm = q.norm(2, {1}, /*keepdim=*/true);
  return q / norm.clamp_min(1e-12);
}

at::Tensor attention_loss(const at::Tensor& student_features, const at::Tensor& teacher_features, double beta, double p,
                          const std::string& where) {
  for (const at::Tensor* t : {&student_features, &teacher_features})
    if (t->dim() != 4)
      throw Error(prefix(where) + "attention transfer needs [N, C, H, W] features, got " + shape_str(t->sizes().vec()),
                  ErrorKind::kUsage);
  const auto s = student_features.sizes(), t = teacher_features.sizes();
  if (s[0] != t[0] || s[2] != t[2] || s[3] != t[3])
    throw Error(prefix(where) + "attention transfer: the student's " + shape_str(s.vec()) + " and the teacher's " +
                    shape_str(t.vec()) + " differ in batch or spatial size",
                ErrorKind::kUsage);
  const at::Tensor diff = attention_map(student_features, p) - attention_map(teacher_features.detach(), p);
  return beta / 2 * diff.norm(2, {1}).mean();
}

at::Tensor hint_loss(const at::Tensor& adapted_student, const at::Tensor& teacher_features, const std::string& where) {
  check_same_shape(adapted_student, teacher_features, "hint features", where);
  return at::mse_loss(adapted_student.to(at::kFloat), teacher_features.detach().to(at::kFloat));
}

GraphModule hint_adapter(const Shape& student_shape, int64_t teacher_channels, std::optional<uint64_t> seed) {
  bool ok = student_shape.size() == 4 && teacher_channels >= 1;
  for (int64_t d : student_shape) ok = ok && d >= 1;
  if (!ok)
    throw Error("hint_adapter: needs student features [N, C, H, W] and teacher channels >= 1, got " +
                    shape_str(student_shape) + " → " + std::to_string(teacher_channels),
                ErrorKind::kUsage);
  GraphBuilder b(seed);
  const std::string x = b.input("student", student_shape);
  const std::string y = b.batch_norm("bn", b.conv2d("conv", x, teacher_channels, 1, 1, 0, 1, /*bias=*/false));
  return GraphModule(b.finish({y}));
}

}  // namespace whittle::distill
