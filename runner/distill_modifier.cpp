#include "runner/distill_modifier.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/file_util.h"
#include "distill/distill.h"
#include "runner/model_loader.h"
#include "runner/modifier.h"

namespace whittle::runner {

namespace {

// Adds the teacher's soft targets (and its attention maps) to the student's loss while active:
//   loss = (1 − α)·hard + α·KD(s, t, T)   when kd is a method (else loss = hard)
//        + Σ_pairs β/2·‖Q̂_s − Q̂_t‖₂       when attention is.
class DistillModifier : public Modifier {
 public:
  DistillModifier(const ModifierSpec& spec, DistillModifierOptions o) : Modifier(spec), o_(std::move(o)) {
    if (o_.teacher.empty()) fail("key 'teacher' is required: a whittle checkpoint or TorchScript file of the teacher");
    if (o_.method.empty()) fail("key 'method' lists no method (kd, attention)");
    for (const auto& m : o_.method) {
      if (m == "kd") kd_ = true;
      else if (m == "attention") attention_ = true;
      else if (m == "hint")
        fail("method 'hint' needs a learned adapter, which the recipe modifier does not train yet; use kd or "
             "attention here, or distill::hint_adapter and distill::hint_loss from C++");
      else fail("method '" + m + "' is not one of kd, attention");
    }
    if (attention_ && o_.pairs.empty()) fail("method 'attention' needs 'pairs' (\"student_value:teacher_value\", ...)");
    if (!attention_ && !o_.pairs.empty()) fail("'pairs' is for method 'attention'; add it to 'method' or drop 'pairs'");
    for (const auto& p : o_.pairs) {
      const size_t colon = p.find(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == p.size())
        fail("pair '" + p + "' must be \"student_value:teacher_value\"");
      pairs_.emplace_back(p.substr(0, colon), p.substr(colon + 1));
    }
  }

  void on_start(TrainContext& tc) override {
    if (!path_exists(o_.teacher)) fail("key 'teacher': " + o_.teacher + " is " + describe_path(o_.teacher));
    const Graph& student = tc.model->graph();
    ModelSource src;
    src.file = o_.teacher;
    src.input_shape = student.value(student.inputs().at(0)).shape;
    try {
      teacher_ = std::make_unique<distill::Teacher>(load_model(src));
    } catch (const Error& e) {
      fail("key 'teacher': " + std::string(e.what()));
    }
    const Graph& tg = teacher_->graph();
    const Shape& s_in = student.value(student.inputs().at(0)).shape;
    const Shape& t_in = tg.value(tg.inputs().at(0)).shape;
    if (s_in.size() != t_in.size() || !std::equal(s_in.begin() + 1, s_in.end(), t_in.begin() + 1))
      fail("the teacher " + o_.teacher + " takes " + shape_str(t_in) + " images, the student " + shape_str(s_in));
    const Shape& s_out = student.value(student.outputs().at(0)).shape;
    const Shape& t_out = tg.value(tg.outputs().at(0)).shape;
    if (kd_ && (s_out.size() != 2 || t_out.size() != 2 || s_out[1] != t_out[1]))
      fail("kd needs logits of the same classes: the teacher gives " + shape_str(t_out) + ", the student " + shape_str(s_out));
    for (const auto& [s, t] : pairs_) {
      if (!student.has_value(s)) fail("pair '" + s + ":" + t + "': the student has no value '" + s + "'");
      if (!tg.has_value(t)) fail("pair '" + s + ":" + t + "': the teacher has no value '" + t + "'");
      const Shape& a = student.value(s).shape;
      const Shape& b = tg.value(t).shape;
      if (a.size() != 4 || b.size() != 4 || a[2] != b[2] || a[3] != b[3])
        fail("pair '" + s + ":" + t + "': attention transfer needs [N, C, H, W] features of the same H, W; the student's is " +
             shape_str(a) + ", the teacher's " + shape_str(b));
      teacher_values_.push_back(t);
    }
    teacher_->to(tc.device);
  }

  std::vector<std::string> captures() const override {
    std::vector<std::string> out;
    for (const auto& p : pairs_) out.push_back(p.first);
    return out;
  }

  at::Tensor on_loss(TrainContext& tc, const at::Tensor& loss, const at::Tensor& input, const at::Tensor& target,
                     const at::Tensor& logits) override {
    std::map<std::string, at::Tensor> tf;
    const at::Tensor t_logits = teacher_->forward(input, teacher_values_, &tf);
    at::Tensor total = loss;
    add("hard_loss", loss);
    if (kd_) {
      const at::Tensor kd = distill::kd_loss(logits, t_logits.to(logits.device()), o_.temperature);
      add("kd_loss", kd);
      total = (1 - o_.alpha) * loss + o_.alpha * kd;
    }
    for (const auto& [s, t] : pairs_) {
      const at::Tensor* sf = nullptr;
      if (tc.features) {
        const auto it = tc.features->find(s);
        if (it != tc.features->end()) sf = &it->second;
      }
      if (!sf) fail("pair '" + s + ":" + t + "': the student no longer has the value '" + s + "' (changed by another modifier?)");
      const at::Tensor at_loss =
          distill::attention_loss(*sf, tf.at(t).to(logits.device()), o_.beta, 2.0, "pair " + s + ":" + t);
      add("attention_loss", at_loss);
      total = total + at_loss;
    }
    ++batches_;
    return total;
  }

  void epoch_metrics(std::map<std::string, double>& metrics) override {
    if (batches_ == 0) return;
    for (const auto& [k, v] : sums_) metrics[k] = v / static_cast<double>(batches_);
    sums_.clear();
    batches_ = 0;
  }

  std::string state() const override {
    nlohmann::json j;
    j["batches"] = batches_;
    j["sums"] = sums_;
    return j.dump();
  }
  void load_state(const std::string& text) override {
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      batches_ = j.at("batches").get<int64_t>();
      sums_ = j.at("sums").get<std::map<std::string, double>>();
    } catch (const std::exception& e) {
      throw Error(spec().location + ": modifier 'distill': unreadable saved state: " + e.what());
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(spec().location + ": modifier 'distill': " + what, ErrorKind::kUsage);
  }
  void add(const std::string& key, const at::Tensor& v) { sums_[key] += v.detach().item<double>(); }

  DistillModifierOptions o_;
  bool kd_ = false, attention_ = false;
  std::vector<std::pair<std::string, std::string>> pairs_;
  std::vector<std::string> teacher_values_;
  std::unique_ptr<distill::Teacher> teacher_;
  std::map<std::string, double> sums_;  // this epoch's sums of each loss term (attention: over pairs)
  int64_t batches_ = 0;
};

}  // namespace

const OptionsSchema<DistillModifierOptions>& distill_modifier_schema() {
  static const OptionsSchema<DistillModifierOptions> schema =
      OptionsSchema<DistillModifierOptions>()
          .add("teacher", &DistillModifierOptions::teacher, "the teacher: a whittle checkpoint (.h5) or a TorchScript file", {},
               "required")
          .add("method", &DistillModifierOptions::method, "kd (Hinton et al. 2015) and/or attention (Zagoruyko & Komodakis 2017)")
          .add("temperature", &DistillModifierOptions::temperature, "kd: softmax temperature T (the loss is scaled by T²)")
          .in_range(Range::above(0))
          .add("alpha", &DistillModifierOptions::alpha, "kd: weight of the KD term; the hard-label loss gets 1 − alpha")
          .in_range(Range::closed(0, 1))
          .add("beta", &DistillModifierOptions::beta, "attention: β of β/2·‖Q̂_s − Q̂_t‖₂, per pair")
          .in_range(Range::at_least(0))
          .add("pairs", &DistillModifierOptions::pairs, "attention: feature pairs \"student_value:teacher_value\"");
  return schema;
}

void register_distill_modifier() {
  ModifierInfo d;
  d.name = "distill";
  d.description = "knowledge distillation from a frozen teacher: kd, attention transfer (docs/distillation.md)";
  d.settings = distill_modifier_schema().keys();
  d.create = [](const ModifierSpec& spec) {
    return std::make_unique<DistillModifier>(spec,
                                             distill_modifier_schema().parse(spec.settings, spec.location + ": modifier 'distill'"));
  };
  register_modifier(std::move(d));
}

}  // namespace whittle::runner
