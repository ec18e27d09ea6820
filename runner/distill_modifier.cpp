#include "runner/distill_modifier.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_number.h"
#include "distill/distill.h"
#include "export/checkpoint.h"
#include "runner/model_loader.h"
#include "runner/modifier.h"

namespace whittle::runner {

namespace {

// Adds the teacher's soft targets (its attention maps, its features) to the student's loss while active:
//   loss = (1 − α)·hard + α·KD(s, t, T)        when kd is a method (else loss = hard)
//        + Σ_pairs β/2·‖Q̂_s − Q̂_t‖₂            when attention is
//        + Σ_pairs w·MSE(adapter_p(F_s), F_t)   when hint is (adapters trained with the student).
class DistillModifier : public Modifier {
 public:
  DistillModifier(const ModifierSpec& spec, DistillModifierOptions o) : Modifier(spec), o_(std::move(o)) {
    if (o_.teacher.empty()) fail("key 'teacher' is required: a whittle checkpoint or TorchScript file of the teacher");
    if (o_.method.empty()) fail("key 'method' lists no method (kd, attention)");
    for (const auto& m : o_.method) {
      if (m == "kd") kd_ = true;
      else if (m == "attention") attention_ = true;
      else if (m == "hint") hint_ = true;
      else fail("method '" + m + "' is not one of kd, attention, hint");
    }
    if ((attention_ || hint_) && o_.pairs.empty())
      fail(std::string("method '") + (attention_ ? "attention" : "hint") + "' needs 'pairs' (\"student_value:teacher_value\", ...)");
    if (!attention_ && !hint_ && !o_.pairs.empty())
      fail("'pairs' is for methods 'attention' and 'hint'; add one to 'method' or drop 'pairs'");
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
    if (tc.recipe && !o_.accept_other_normalization) check_teacher_normalization(tc.recipe->data);
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
        fail("pair '" + s + ":" + t + "': attention transfer and hints need [N, C, H, W] features of the same H, W; the "
             "student's is " + shape_str(a) + ", the teacher's " + shape_str(b));
      teacher_values_.push_back(t);
      if (hint_) {
        GraphModule adapter = distill::hint_adapter(a, b[1]);
        adapter->to(tc.device);
        adapter->train();
        adapters_.push_back(adapter);
      }
    }
    teacher_->to(tc.device);
  }

  // A teacher fed inputs normalized otherwise than it was trained on gives soft targets for other
  // images (a student reached 77.7 % instead of 96.7 %). A checkpoint records its recipe; a
  // TorchScript file, or a checkpoint written without one, cannot be checked.
  void check_teacher_normalization(const DataSpec& student) const {
    if (!is_hdf5_file(o_.teacher)) return;
    const std::string recipe = checkpoint_recipe(o_.teacher);
    if (recipe.empty()) return;
    const DataSpec teacher = parse_recipe_data(recipe, o_.teacher + " (its recipe)");
    auto normalization = [](const DataSpec& d) {
      if (d.mean.empty()) return std::string("no normalization");
      auto list = [](const std::vector<double>& v) {
        std::string s = "[";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + SettingValue(v[i]).text();
        return s + "]";
      };
      return "mean " + list(d.mean) + ", std " + list(d.std);
    };
    if (teacher.mean != student.mean || teacher.std != student.std)
      fail("the teacher " + o_.teacher + " was trained on inputs with " + normalization(teacher) +
           "; this run gives it inputs with " + normalization(student) +
           ": its soft targets would be for other inputs; give data.mean and data.std as the teacher's recipe does, or "
           "set accept_other_normalization: true to use it anyway");
  }

  std::vector<at::Tensor> parameters() override {
    std::vector<at::Tensor> out;
    for (auto& a : adapters_)
      for (auto& p : a->parameters()) out.push_back(p);
    return out;
  }

  std::vector<GraphModule> parameter_modules() override { return adapters_; }

  std::vector<std::pair<std::string, at::Tensor>> state_tensors() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t i = 0; i < adapters_.size(); ++i) {
      for (const auto& p : adapters_[i]->named_parameters()) out.emplace_back("hint" + std::to_string(i) + "." + p.key(), p.value());
      for (const auto& b : adapters_[i]->named_buffers()) out.emplace_back("hint" + std::to_string(i) + "." + b.key(), b.value());
    }
    return out;
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
    for (size_t i = 0; i < pairs_.size(); ++i) {
      const auto& [s, t] = pairs_[i];
      const at::Tensor* sf = nullptr;
      if (tc.features) {
        const auto it = tc.features->find(s);
        if (it != tc.features->end()) sf = &it->second;
      }
      if (!sf) fail("pair '" + s + ":" + t + "': the student no longer has the value '" + s + "' (changed by another modifier?)");
      const at::Tensor tfeat = tf.at(t).to(logits.device());
      const std::string where = "pair " + s + ":" + t;
      if (attention_) {
        const at::Tensor at_loss = distill::attention_loss(*sf, tfeat, o_.beta, 2.0, where);
        add("attention_loss", at_loss);
        total = total + at_loss;
      }
      if (hint_) {
        const at::Tensor h = o_.hint_weight * distill::hint_loss(adapters_[i]->forward(*sf), tfeat, where);
        add("hint_loss", h);
        total = total + h;
      }
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
      batches_ = json_int64(j.at("batches"), "batches");
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
  bool kd_ = false, attention_ = false, hint_ = false;
  std::vector<GraphModule> adapters_;  // hint: one per pair (train mode), on the student's device
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
          .add("method", &DistillModifierOptions::method,
               "any of kd (Hinton et al. 2015), attention (Zagoruyko & Komodakis 2017), hint (FitNets, Romero et al. 2015)")
          .add("temperature", &DistillModifierOptions::temperature, "kd: softmax temperature T (the loss is scaled by T²)")
          .in_range(Range::above(0))
          .add("alpha", &DistillModifierOptions::alpha, "kd: weight of the KD term; the hard-label loss gets 1 − alpha")
          .in_range(Range::closed(0, 1))
          .add("beta", &DistillModifierOptions::beta, "attention: β of β/2·‖Q̂_s − Q̂_t‖₂, per pair")
          .in_range(Range::at_least(0))
          .add("hint_weight", &DistillModifierOptions::hint_weight, "hint: weight of the adapter-to-teacher MSE, per pair")
          .in_range(Range::at_least(0))
          .add("pairs", &DistillModifierOptions::pairs, "attention, hint: feature pairs \"student_value:teacher_value\"")
          .add("accept_other_normalization", &DistillModifierOptions::accept_other_normalization,
               "take a teacher checkpoint whose recipe normalized its inputs with another data.mean or data.std");
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
  d.label = [](const ModifierSpec&) { return std::string("KD"); };
  register_modifier(std::move(d));
}

}  // namespace whittle::runner
