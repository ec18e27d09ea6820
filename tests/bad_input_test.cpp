// Bad input, through the C++ API: recipe values out of range, non-finite, repeated keys, modifier
// windows outside the run, patterns that match nothing, runs that would make no step or whose loss
// stops being finite, empty datasets, loader limits, a run directory in use or holding a previous
// run, and ATen errors named by node. Each asserts the error's kind, what its message names, and
// that no file was created, replaced or left half-written where that applies.

#include <gtest/gtest.h>

#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "data/hdf5_dataset.h"
#include "data/loader.h"
#include "export/checkpoint.h"
#include "graph/graph_module.h"
#include "graph/select.h"
#include "graph/zoo.h"
#include "runner/modifier.h"
#include "runner/modifier_options.h"
#include "runner/recipe.h"
#include "runner/trainer.h"
#include "support.h"

namespace whittle::runner {
namespace {

using test::binary_dir;
using test::source_dir;

std::string fresh_dir(const std::string& name) {
  const std::string dir = join_path(binary_dir(), "testdata/bad_input/" + name);
  remove_tree(dir);
  make_directories(parent_directory(dir));
  return dir;  // does not exist yet
}

std::string mnist() { return join_path(source_dir(), "data/mnist10k"); }

// A quick LeNet-5 recipe: 256 training images in batches of 32 (8 steps an epoch), `epochs`
// epochs, then `extra` (more sections, or a modifiers list).
std::string recipe_text(int epochs, const std::string& extra = "", const std::string& data_extra = "") {
  return "model: {name: lenet5}\n"
         "data: {train: " + mnist() + ", test: " + mnist() +
         ", test_split: t10k, batch_size: 32, train_limit: 256, test_limit: 64, num_workers: 0" + data_extra +
         "}\n"
         "training:\n"
         "  epochs: " + std::to_string(epochs) + "\n"
         "  optimizer: {name: sgd, lr: 0.01, momentum: 0.9}\n"
         "  threads: 1\n" + extra;
}

std::string usage_error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_recipe(text, "r.yaml", source_dir(), overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  return "no error";
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// ---------------------------------------------------------------- recipe values

// Item 12: every value is range-checked with the key and the line (here: --set, or line 4).
TEST(RecipeRanges, OutOfRangeValuesNameTheKeyAndLine) {
  const std::string r = recipe_text(1);
  EXPECT_HAS(usage_error_of(r, {"training.label_smoothing=2"}), "r.yaml (--set): 'training.label_smoothing' is 2; it must be in [0, 1)");
  EXPECT_HAS(usage_error_of(r, {"data.random_crop_padding=-5"}), "'data.random_crop_padding' is -5; it must be in 0..1024");
  EXPECT_HAS(usage_error_of(r, {"training.threads=-1"}), "'training.threads' is -1; it must be in 0..1024");
  EXPECT_HAS(usage_error_of(r, {"training.lr_schedule.warmup_epochs=-1"}),
             "'training.lr_schedule.warmup_epochs' is -1; it must be ≥ 0");
  EXPECT_HAS(usage_error_of(r, {"training.optimizer.momentum=1"}), "'training.optimizer.momentum' is 1; it must be in [0, 1)");
  EXPECT_HAS(usage_error_of(r, {"data.mean=[0.5, 2]"}), "'data.mean' is 2; it must be in 0..1");
  // Item 9: loader limits up front.
  EXPECT_HAS(usage_error_of(r, {"data.num_workers=100000"}), "'data.num_workers' is 100000; it must be in 0..256");
  // The line of a value in the file.
  EXPECT_HAS(usage_error_of(recipe_text(1) + "outputs: {dir: x}\n", {}), "no error");
  const std::string in_file = "model: {name: lenet5}\ndata: {train: " + mnist() + ", test: " + mnist() +
                              "}\ntraining:\n  label_smoothing: 1.5\n";
  EXPECT_HAS(usage_error_of(in_file), "r.yaml:4: 'training.label_smoothing' is 1.5");
}

// Optimizer settings LibTorch would refuse when it builds the optimizer are recipe errors naming
// the keys (issue 47, item 10).
TEST(RecipeRanges, OptimizerSettingsLibTorchRefusesAreNamed) {
  const std::string r = recipe_text(1);
  EXPECT_HAS(usage_error_of(r, {"training.optimizer.nesterov=true", "training.optimizer.momentum=0"}),
             "'training.optimizer.nesterov' needs a momentum above 0 ('training.optimizer.momentum' is 0)");
  EXPECT_HAS(usage_error_of(r, {"training.optimizer.name=adam", "training.optimizer.nesterov=true"}),
             "'training.optimizer.nesterov' applies to sgd, not adam");
  EXPECT_HAS(usage_error_of(r, {"training.optimizer.nesterov=true"}), "no error");  // momentum 0.9
}

// Item 5: non-finite numbers are recipe errors wherever they appear.
TEST(RecipeRanges, NonFiniteNumbersAreRejected) {
  const std::string r = recipe_text(1);
  EXPECT_HAS(usage_error_of(r, {"training.optimizer.lr=.inf"}), "'training.optimizer.lr' is .inf; recipe numbers must be finite");
  EXPECT_HAS(usage_error_of(r, {"training.optimizer.lr=.nan"}), "recipe numbers must be finite");
  EXPECT_HAS(usage_error_of(r, {"training.grad_clip_norm=-.inf"}), "must be finite");
  EXPECT_HAS(usage_error_of(r, {"training.lr_schedule.milestones=[1, .inf]"}), "'training.lr_schedule.milestones' is .inf");
  EXPECT_HAS(usage_error_of(r + "modifiers:\n  - {name: quantize, activation_clip: .nan}\n"),
             "'modifiers.0.activation_clip' is .nan; recipe numbers must be finite");
}

// Item 3: 0 bits is rejected in a recipe (the C++ quantize::Config documents 0 as the method's
// default; a recipe leaves the key out for that).
TEST(RecipeRanges, ZeroBitsAreRejected) {
  const std::string r = recipe_text(1, "modifiers:\n  - {name: quantize, method: dorefa}\n");
  EXPECT_HAS(usage_error_of(r, {"modifiers.0.weight_bits=0"}), "'modifiers.0.weight_bits' is 0; it must be in 1..32");
  EXPECT_HAS(usage_error_of(r, {"modifiers.0.activation_bits=0"}), "'modifiers.0.activation_bits' is 0; it must be in 1..32");
  // OptionsSchema::parse holds the same range for settings built in C++.
  ModifierSpec spec;
  spec.name = "quantize";
  spec.location = "api";
  spec.settings["weight_bits"] = int64_t{0};
  try {
    modifier_info("quantize").create(spec);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_HAS(e.what(), "api: modifier 'quantize', key 'weight_bits': 0 is outside 1..32");
  }
}

// Item 7: a key given twice names both lines, at any depth and in modifier entries.
TEST(RecipeKeys, DuplicateKeysNameBothLines) {
  const std::string top = "model: {name: lenet5}\ndata: {train: " + mnist() + ", test: " + mnist() +
                          "}\ntraining: {epochs: 1}\ntraining:\n  epochs: 2\n";
  EXPECT_HAS(usage_error_of(top), "r.yaml:4: key 'training' is given twice (also at r.yaml:3)");
  const std::string nested = "model: {name: lenet5}\ndata: {train: " + mnist() + ", test: " + mnist() +
                             "}\ntraining:\n  epochs: 1\n  seed: 1\n  epochs: 2\n";
  EXPECT_HAS(usage_error_of(nested), "r.yaml:6: key 'training.epochs' is given twice (also at r.yaml:4)");
  EXPECT_HAS(usage_error_of(recipe_text(1, "modifiers:\n  - name: quantize\n    weight_bits: 4\n    weight_bits: 2\n")),
             "key 'modifiers.0.weight_bits' is given twice");
}

// Item 15: an empty value says so (it is not "a list").
TEST(RecipeKeys, EmptyValueIsNamed) {
  EXPECT_HAS(usage_error_of(recipe_text(1, "outputs:\n  checkpoint:\n")),
             "'outputs.checkpoint' must be a string, got an empty value");
}

// A list key given something else shows a list of its own kind: a choice, names or numbers.
TEST(RecipeKeys, ListExamplesFitTheKey) {
  EXPECT_HAS(usage_error_of(recipe_text(1, "outputs:\n  export: {onnx: 1}\n")),
             "'outputs.export' must be a list of strings, e.g. [onnx]");
  EXPECT_HAS(usage_error_of(recipe_text(1, "modifiers:\n  - {name: quantize, method: dorefa, targets: {a: 1}}\n")),
             "'modifiers.0.targets' must be a list of strings, e.g. [conv1, layer2]");
  EXPECT_HAS(usage_error_of(recipe_text(1), {"data.mean={a: 1}"}), "'data.mean' must be a list of numbers, e.g. [1, 2]");
}

// An empty --set value is refused, for a key and for a whole section or list (--set modifiers=
// would otherwise train without them); [] and {} say "empty".
TEST(RecipeOverrides, EmptyValueIsRefused) {
  const std::string w2 = recipe_text(1, "modifiers:\n  - {name: quantize, method: dorefa, weight_bits: 2}\n");
  for (const std::string set : {"outputs.checkpoint=", "modifiers=", "training=", "training.optimizer=",
                                "training.lr_schedule=~", "outputs=null"}) {
    const std::string path = set.substr(0, set.find('='));
    EXPECT_HAS(usage_error_of(w2, {set}),
               "--set '" + set + "': no value for '" + path + "' (an empty list is [], an empty section {})");
  }
  EXPECT_TRUE(parse_recipe(w2, "r.yaml", source_dir(), {"modifiers=[]"}).modifiers.empty());
}

// Item 16: --set appends a list entry at index size(), and creates the list for entry 0.
TEST(RecipeOverrides, SetAppendsModifiers) {
  const std::string one = recipe_text(1, "modifiers:\n  - {name: quantize, method: dorefa}\n");
  Recipe r = parse_recipe(one, "r.yaml", source_dir(), {"modifiers.1={name: fuse_batchnorm}"});
  ASSERT_EQ(r.modifiers.size(), 2u);
  EXPECT_EQ(r.modifiers[1].name, "fuse_batchnorm");
  EXPECT_HAS(r.modifiers[1].location, "(--set)");
  Recipe none = parse_recipe(recipe_text(1), "r.yaml", source_dir(), {"modifiers.0={name: quantize, weight_bits: 4}"});
  ASSERT_EQ(none.modifiers.size(), 1u);
  EXPECT_EQ(none.modifiers[0].settings["weight_bits"].as<int64_t>(), 4);
  // Past the end, or a key of an entry that does not exist yet.
  EXPECT_HAS(usage_error_of(one, {"modifiers.2={name: quantize}"}), "the next entry to append is 1");
  EXPECT_HAS(usage_error_of(one, {"modifiers.1.weight_bits=4"}),
             "a whole new entry can be appended: --set modifiers.1={name: ...}");
}

// Item 2: a window outside the run, or empty, is a recipe error naming the entry.
TEST(RecipeModifiers, WindowsOutsideTheRunAreErrors) {
  const std::string q = "modifiers:\n  - {name: quantize, method: dorefa, start_epoch: ";
  EXPECT_HAS(usage_error_of(recipe_text(1, q + "5}\n")),
             "r.yaml:8, modifiers.0: modifier 'quantize': start_epoch 5 is not inside the run of 1 epoch(s)");
  EXPECT_HAS(usage_error_of(recipe_text(2, q + "2}\n")), "start_epoch 2 is not inside the run of 2 epoch(s)");
  EXPECT_HAS(usage_error_of(recipe_text(1, q + "-3}\n")), "'modifiers.0.start_epoch' is -3; it must be ≥ 0");
  EXPECT_HAS(usage_error_of(recipe_text(2, q + "1, end_epoch: 1}\n")), "end_epoch 1 is not after start_epoch 1");
  EXPECT_HAS(usage_error_of(recipe_text(2, q + "0, end_epoch: -0.5}\n")), "end_epoch -0.5 is not after start_epoch 0");
  EXPECT_HAS(usage_error_of(recipe_text(2, q + "0, end_epoch: -2}\n")), "'modifiers.0.end_epoch' is -2; it must be ≥ -1");
  EXPECT_EQ(usage_error_of(recipe_text(2, q + "1.5}\n")), "no error");
}

// Item 13: a regular expression that does not compile is a recipe error naming the entry.
TEST(RecipeModifiers, BadRegexIsARecipeError) {
  EXPECT_HAS(usage_error_of(recipe_text(1, "modifiers:\n  - {name: quantize, targets: ['re:(']}\n")),
             "r.yaml:8, modifiers.0: modifier 'quantize': invalid regular expression 're:('");
  EXPECT_HAS(usage_error_of(recipe_text(1, "modifiers:\n  - {name: quantize, ignore: ['re:[a-']}\n")),
             "invalid regular expression 're:[a-'");
  EXPECT_EQ(pattern_problem("re:conv[12]"), "");
  EXPECT_HAS(pattern_problem("re:conv[12"), "invalid regular expression");
}

// ---------------------------------------------------------------- the Trainer

RunOptions quiet(const std::string& dir, std::ostringstream& log) {
  RunOptions o;
  o.out_dir = dir;
  o.log = &log;
  return o;
}

// Expects Trainer(recipe with `overrides`) to throw a usage error naming `needle`, creating
// nothing at `dir`.
void expect_refused_creating_nothing(const std::string& text, const std::string& dir, const std::string& needle,
                                     const std::vector<std::string>& overrides = {}) {
  const Recipe r = parse_recipe(text, "r.yaml", source_dir(), overrides);
  std::ostringstream log;
  try {
    Trainer t(r, quiet(dir, log));
    FAIL() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_HAS(e.what(), needle);
  }
  EXPECT_FALSE(path_exists(dir)) << dir << " was created";
}

// The binary methods' options and stages and the graph_pass modifier: what would do nothing, or
// drop a modifier's work during training, is refused naming the entry; a stage that writes a
// default out agrees with one that leaves it out; weights cannot return to 32 bits.
TEST(RecipeModifiers, BinaryOptionsStagesAndGraphPass) {
  auto created = [](const std::string& text) -> std::string {
    try {
      const Recipe r = parse_recipe(text, "r.yaml", source_dir());
      for (const auto& m : r.modifiers) modifier_info(m.name).create(m);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      return e.what();
    }
    return "no error";
  };
  EXPECT_HAS(created(recipe_text(1, "modifiers:\n  - {name: graph_pass, pass: quantize}\n")),
             "r.yaml:8, modifiers.0: modifier 'graph_pass': key 'pass': 'quantize' has its modifier of the same name");
  EXPECT_HAS(created(recipe_text(1, "modifiers:\n  - {name: graph_pass}\n")), "key 'pass' is required");
  EXPECT_HAS(created(recipe_text(1, "modifiers:\n  - {name: quantize, method: bnn, activation_bits: 32, learned_threshold: true}\n")),
             "key 'learned_threshold': applies to binary activations");
  EXPECT_HAS(created(recipe_text(1, "modifiers:\n  - {name: quantize, method: xnor, ede_t_min: 0.5}\n")),
             "key 'ede_t_min': applies with sign_gradient ede only");
  EXPECT_HAS(created(recipe_text(1, "modifiers:\n  - {name: quantize, method: bnn, sign_gradient: ede, ede_t_max: 0.01}\n")),
             "key 'ede_t_max': 0.01 is below ede_t_min 0.1");

  const std::string both = "modifiers:\n  - {name: quantize, method: bnn, weight_bits: 32}\n"
                           "  - {name: quantize, method: bnn, start_epoch: 1, sign_gradient: ste, learned_threshold: false}\n";
  std::ostringstream log;
  EXPECT_NO_THROW(Trainer(parse_recipe(recipe_text(2, both), "r.yaml", source_dir()), quiet(fresh_dir("binary_stages"), log)));
  expect_refused_creating_nothing(
      recipe_text(2, "modifiers:\n  - {name: quantize, method: bnn}\n  - {name: quantize, method: bnn, weight_bits: 32, start_epoch: 1}\n"),
      fresh_dir("binary_stages_back"), "that entry quantized them to 1 bits; they cannot return to 32");
}

int64_t count_op(const Graph& g, const std::string& op) {
  int64_t n = 0;
  for (const auto& node : g.nodes()) n += node.op == op ? 1 : 0;
  return n;
}

// Item 1: start_epoch 1.5 in a 2-epoch run of 8 batches an epoch attaches the quantizers at the
// step of epoch 1.5: epoch 2's batch 5 (index 4), not at an epoch boundary, not never.
TEST(TrainerWindows, ModifierStartsMidEpoch) {
  const std::string dir = fresh_dir("mid_epoch");
  const Recipe r = parse_recipe(
      recipe_text(2, "modifiers:\n  - {name: quantize, method: dorefa, weight_bits: 2, activation_bits: 2, start_epoch: 1.5}\n"),
      "r.yaml", source_dir());
  std::ostringstream log;
  Trainer tr(r, quiet(dir, log));
  ASSERT_EQ(tr.train_loader().num_batches(), 8);
  ASSERT_TRUE(tr.train_epoch());
  tr.end_epoch();
  EXPECT_EQ(count_op(tr.model()->graph(), "act_quant"), 0) << "quantized during epoch 1";
  tr.model()->train();
  for (int64_t i = 0; i < 8; ++i) {
    tr.step(tr.train_loader().batch(1, i));
    const int64_t expected = i < 4 ? 0 : 3;  // conv2, fc1, fc2 (first and last layers stay FP32)
    EXPECT_EQ(count_op(tr.model()->graph(), "act_quant"), expected) << "after epoch 2 batch " << i + 1;
  }
  EXPECT_EQ(tr.modifiers()[0]->state(), R"({"applied":true})");
  tr.end_epoch();
  // The checkpoint holds the 2-bit layers.
  const Checkpoint c = load_checkpoint(join_path(dir, "model.h5"));
  EXPECT_EQ(count_op(c.graph, "act_quant"), 3);
  EXPECT_EQ(c.graph.node("conv2").attr_int("weight_bits"), 2);
}

// Item 1 through run(): the same window, the whole run, quantized from the middle of epoch 2 on.
TEST(TrainerWindows, FractionalStartInAOneEpochRun) {
  const std::string dir = fresh_dir("half_epoch");
  const Recipe r = parse_recipe(recipe_text(1, "modifiers:\n  - {name: quantize, method: dorefa, start_epoch: 0.5}\n"),
                                "r.yaml", source_dir());
  std::ostringstream log;
  Trainer tr(r, quiet(dir, log));
  tr.model()->train();
  for (int64_t i = 0; i < 4; ++i) tr.step(tr.train_loader().batch(0, i));
  EXPECT_EQ(count_op(tr.model()->graph(), "act_quant"), 0);
  tr.step(tr.train_loader().batch(0, 4));
  EXPECT_EQ(count_op(tr.model()->graph(), "act_quant"), 3);
}

// Item 2, the part that needs the data: a window opening after the last step (epoch 0.875 with 8
// batches) never applies.
TEST(TrainerWindows, WindowAfterTheLastStepIsRefused) {
  const std::string dir = fresh_dir("late_window");
  expect_refused_creating_nothing(recipe_text(1, "modifiers:\n  - {name: quantize, start_epoch: 0.9}\n"), dir,
                                  "start_epoch 0.9 is after the run's last step (epoch 0.875, with 8 batches an epoch)");
}

// Item 4: a batch larger than the training set with drop_last makes no step.
TEST(TrainerChecks, NoStepIsAnError) {
  const std::string dir = fresh_dir("no_step");
  expect_refused_creating_nothing(recipe_text(1), dir, "'data.batch_size' 1000000000 is more than the 256 training images",
                                  {"data.batch_size=1000000000"});
  // Without drop_last the one short batch is a step.
  std::ostringstream log;
  Trainer t(parse_recipe(recipe_text(1), "r.yaml", source_dir(), {"data.batch_size=1000", "data.drop_last=false"}),
            quiet(dir, log));
  EXPECT_EQ(t.train_loader().num_batches(), 1);
}

// Item 13: a target that matches no node is refused before anything is created.
TEST(TrainerChecks, TargetsMatchingNothingCreateNothing) {
  const std::string dir = fresh_dir("no_match");
  expect_refused_creating_nothing(recipe_text(1, "modifiers:\n  - {name: quantize, targets: [nothing_matches]}\n"), dir,
                                  "r.yaml:8, modifiers.0: modifier 'quantize': target pattern 'nothing_matches' "
                                  "matches no node of the model");
  expect_refused_creating_nothing(recipe_text(1, "modifiers:\n  - {name: quantize, targets: ['re:layer.*']}\n"), dir,
                                  "target pattern 're:layer.*' matches no node");
  expect_refused_creating_nothing(recipe_text(1, "modifiers:\n  - {name: quantize, ignore: [conv9]}\n"), dir,
                                  "ignore pattern 'conv9' matches no node");
}

// Images that do not fit the model are refused up front, naming the set and both shapes.
TEST(TrainerChecks, ImagesOfAnotherShapeAreRefused) {
  const std::string dir = fresh_dir("shape");
  const std::string h5 = join_path(binary_dir(), "testdata/bad_input/rgb.h5");
  data::Dataset rgb;
  rgb.images = at::zeros({4, 3, 28, 28}, at::kByte);
  rgb.labels = at::zeros({4}, at::kLong);
  data::write_hdf5_dataset(rgb, h5);
  expect_refused_creating_nothing(recipe_text(1), dir,
                                  "'data.test' images are [3, 28, 28] (C, H, W) but the model 'lenet5' takes [1, 28, 28]",
                                  {"data.test=" + h5});
}

// A modifier (tests only) whose loss turns NaN at a given step.
struct PoisonOptions {
  int64_t at_step = 1;
  std::string gradient;  ///< a parameter whose gradient turns NaN (the loss staying finite) instead
};
const OptionsSchema<PoisonOptions>& poison_schema() {
  static const auto s = OptionsSchema<PoisonOptions>()
                            .add("at_step", &PoisonOptions::at_step, "step whose loss is NaN")
                            .add("gradient", &PoisonOptions::gradient, "parameter whose gradient is NaN instead");
  return s;
}
class PoisonLoss : public Modifier {
 public:
  PoisonLoss(const ModifierSpec& spec, PoisonOptions o) : Modifier(spec), o_(o) {}
  at::Tensor on_loss(TrainContext& tc, const at::Tensor& loss, const at::Tensor&, const at::Tensor&,
                     const at::Tensor&) override {
    if (tc.step + 1 != o_.at_step) return loss;
    if (o_.gradient.empty()) return loss * std::numeric_limits<double>::quiet_NaN();
    // 0·sqrt(p − p) is 0, but its gradient is 0·∞ = NaN.
    for (const auto& p : tc.model->named_parameters())
      if (p.key() == o_.gradient) return loss + at::sqrt(p.value() - p.value().detach()).sum() * 0.0;
    throw Error("no parameter " + o_.gradient);
  }

 private:
  PoisonOptions o_;
};

// Registers the modifier `test_poison` (PoisonLoss) for the tests below.
void register_poison_modifier() {
  ModifierInfo info;
  info.name = "test_poison";
  info.description = "NaN loss, or a NaN gradient, at a step (tests)";
  info.settings = poison_schema().keys();
  info.create = [](const ModifierSpec& s) { return std::make_unique<PoisonLoss>(s, poison_schema().parse(s.settings, s.location)); };
  register_modifier(info);
}

// Item 5: a non-finite loss stops the run (a runtime error naming the step) and leaves the files
// of the last finished epoch byte for byte.
TEST(TrainerChecks, NonFiniteLossStopsKeepingTheLastCheckpoint) {
  register_poison_modifier();
  const std::string dir = fresh_dir("nan_loss");
  const Recipe r = parse_recipe(recipe_text(2, "modifiers:\n  - {name: test_poison, at_step: 11}\n"), "r.yaml",
                                source_dir());
  std::ostringstream log;
  Trainer tr(r, quiet(dir, log));
  ASSERT_TRUE(tr.train_epoch());
  tr.end_epoch();
  const std::string ckpt = read_file(join_path(dir, "model.h5"));
  const std::string state = read_file(join_path(dir, "train_state.pt"));
  try {
    tr.train_epoch();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_HAS(e.what(), "the loss is NaN at step 11 (epoch 2, batch 3 of 8)");
    EXPECT_HAS(e.what(), "are from the end of epoch 1");
  }
  EXPECT_EQ(read_file(join_path(dir, "model.h5")), ckpt);
  EXPECT_EQ(read_file(join_path(dir, "train_state.pt")), state);
}

// Issue 47 item 16: a finite loss whose gradient is not finite stops the run too, naming the first
// parameter with such a gradient, before the optimizer step writes NaN into the weights; the files
// of the last finished epoch stay as they were. require_finite_gradients does the same for a user's
// own loop.
TEST(TrainerChecks, NonFiniteGradientStopsNamingTheParameter) {
  register_poison_modifier();
  const std::string dir = fresh_dir("nan_gradient");
  const Recipe r = parse_recipe(
      recipe_text(2, "modifiers:\n  - {name: test_poison, at_step: 11, gradient: fc2.weight}\n"), "r.yaml", source_dir());
  std::ostringstream log;
  Trainer tr(r, quiet(dir, log));
  ASSERT_TRUE(tr.train_epoch());
  tr.end_epoch();
  const std::string ckpt = read_file(join_path(dir, "model.h5"));
  try {
    tr.train_epoch();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    // Exact at any thread count or instruction set: 0·∞ is NaN in all 84 × 120 entries of fc2.weight.
    EXPECT_HAS(e.what(), "the gradient of fc2.weight holds 10080 NaN or infinite values (the loss is finite) at step 11 "
                         "(epoch 2, batch 3 of 8)");
    EXPECT_HAS(e.what(), "are from the end of epoch 1");
  }
  EXPECT_EQ(read_file(join_path(dir, "model.h5")), ckpt);

  GraphModule m(build_model("lenet5", ZooOptions{}));
  EXPECT_FALSE(find_non_finite_gradient({m}).has_value());  // no gradients yet
  for (auto& p : m->parameters()) p.mutable_grad() = at::zeros_like(p);
  EXPECT_NO_THROW(require_finite_gradients({m}));
  m->named_parameters()["fc3.bias"].mutable_grad()[3] = std::numeric_limits<float>::infinity();
  m->named_parameters()["conv2.weight"].mutable_grad()[0][0][0][0] = std::numeric_limits<float>::quiet_NaN();
  try {
    require_finite_gradients({m});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "training step: the gradient of conv2.weight holds 1 NaN or infinite value");
  }
}

// Item 6: datasets without images are errors, and are never written.
TEST(TrainerChecks, EmptyDatasetsAreErrors) {
  const std::string dir = fresh_dir("empty_data");
  data::Dataset empty;
  empty.images = at::zeros({0, 1, 28, 28}, at::kByte);
  empty.labels = at::zeros({0}, at::kLong);
  const std::string h5 = join_path(binary_dir(), "testdata/bad_input/empty.h5");
  remove_file(h5);
  try {
    data::write_hdf5_dataset(empty, h5);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "holds no images");
  }
  EXPECT_FALSE(path_exists(h5));
  // A recipe whose train_limit keeps nothing is a range error; 0 means all.
  EXPECT_HAS(usage_error_of(recipe_text(1), {"data.train_limit=-1"}), "'data.train_limit' is -1; it must be ≥ 0");
}

// Item 11: a run directory is locked while a Trainer uses it; a finished run there needs
// --resume or --overwrite.
TEST(TrainerRunDirectory, LockedWhileInUseAndNotSilentlyReplaced) {
  const std::string dir = fresh_dir("locked");
  const Recipe r = parse_recipe(recipe_text(1), "r.yaml", source_dir());
  std::ostringstream log;
  {
    Trainer first(r, quiet(dir, log));
    EXPECT_TRUE(is_regular_file(join_path(dir, ".whittle.lock")));
    try {
      Trainer second(r, quiet(dir, log));
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
      EXPECT_HAS(e.what(), dir + " is in use by another whittle run (pid ");
    }
    first.run();
  }
  EXPECT_FALSE(path_exists(join_path(dir, ".whittle.lock")));
  const std::string ckpt = read_file(join_path(dir, "model.h5"));
  try {
    Trainer again(r, quiet(dir, log));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_HAS(e.what(), "already holds a finished run (model.h5, train_state.pt, metrics.jsonl, report.json, recipe.yaml)");
    EXPECT_HAS(e.what(), "--resume continues it, --overwrite replaces it");
  }
  EXPECT_EQ(read_file(join_path(dir, "model.h5")), ckpt);
  RunOptions both = quiet(dir, log);
  both.resume = both.overwrite = true;
  EXPECT_THROW(Trainer(r, both), Error);
  RunOptions over = quiet(dir, log);
  over.overwrite = true;
  {
    Trainer replaced(r, over);
    EXPECT_TRUE(path_exists(join_path(dir, "report.json")));  // the old run stays until this one saves
    EXPECT_EQ(read_file(join_path(dir, "model.h5")), ckpt);
    EXPECT_EQ(replaced.run().epochs_done, 1);
  }
  EXPECT_TRUE(is_regular_file(join_path(dir, "report.json")));
}

// A folder holding a file with a run's name that no run left there (a model.h5 or recipe.yaml of the
// user's own) is not replaced without --overwrite; what a run killed before its first training
// state left (metrics.jsonl, its first write, perhaps a recipe.yaml and a checkpoint) is run again.
// A run never writes its checkpoint over the model it starts from, even with --overwrite.
TEST(TrainerRunDirectory, FilesNoRunLeftAreNotReplaced) {
  const Recipe r = parse_recipe(recipe_text(1), "r.yaml", source_dir());
  std::ostringstream log;
  for (const std::string name : {"model.h5", "recipe.yaml"}) {
    const std::string dir = fresh_dir("users_" + name);
    make_directories(dir);
    write_file_atomic(join_path(dir, name), "my own file");
    try {
      Trainer t(r, quiet(dir, log));
      FAIL() << "no error for " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_HAS(e.what(), "run directory " + dir + " holds " + name + " but no metrics.jsonl, so no whittle run left them");
      EXPECT_HAS(e.what(), "--overwrite replaces them");
    }
    EXPECT_EQ(read_file(join_path(dir, name)), "my own file");
    RunOptions over = quiet(dir, log);
    over.overwrite = true;
    EXPECT_EQ(Trainer(r, over).run().epochs_done, 1);
    EXPECT_NE(read_file(join_path(dir, name)), "my own file");
  }
  const std::string stopped = fresh_dir("killed_before_its_state");
  make_directories(stopped);
  write_file_atomic(join_path(stopped, "metrics.jsonl"), "");
  write_file_atomic(join_path(stopped, "model.h5"), "half a run");
  EXPECT_EQ(Trainer(r, quiet(stopped, log)).run().epochs_done, 1);
  EXPECT_TRUE(is_regular_file(join_path(stopped, "report.json")));

  // The model a run starts from, in the folder the run writes its checkpoint to.
  const std::string from = fresh_dir("starts_from_its_own_checkpoint");
  make_directories(from);
  const std::string input = read_file(join_path(stopped, "model.h5"));
  write_file_atomic(join_path(from, "model.h5"), input);
  const Recipe own = parse_recipe(recipe_text(1), "r.yaml", source_dir(), {"model.file=" + join_path(from, "model.h5")});
  for (const bool overwrite : {false, true}) {
    RunOptions o = quiet(from, log);
    o.overwrite = overwrite;
    try {
      Trainer t(own, o);
      FAIL() << "no error, overwrite " << overwrite;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_HAS(e.what(), "model.file " + join_path(from, "model.h5") + " is the checkpoint this run writes");
    }
  }
  EXPECT_EQ(read_file(join_path(from, "model.h5")), input);
}

// ---------------------------------------------------------------- data and graph

// Item 9: the loader's own limits (the recipe's are checked before, see above).
TEST(LoaderLimits, TooManyWorkersIsAnError) {
  data::Dataset d;
  d.images = at::zeros({4, 1, 2, 2}, at::kByte);
  d.labels = at::zeros({4}, at::kLong);
  data::LoaderOptions o;
  o.batch_size = 2;
  o.num_workers = data::kMaxWorkers + 1;
  try {
    data::DataLoader l(d, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "num_workers must be 0..256, got 257");
  }
  o.num_workers = 2;
  o.prefetch_batches = data::kMaxPrefetchBatches + 1;
  EXPECT_THROW(data::DataLoader(d, o), Error);
}

// Item 14: a window attribute out of range (a stride of 0 read from a damaged file would divide
// by zero in shape inference) is refused naming the node; an ATen error in a node's forward (a
// float64 bias beside float32 weights) names the node, the op and the input shapes,
// without LibTorch's C++ backtrace.
TEST(GraphErrors, BadAttributesAndAtenErrorsNameTheNode) {
  Graph bad_stride = build_model("lenet5");
  bad_stride.node("conv2").attrs["stride"] = std::vector<int64_t>{0, 0};
  try {
    GraphModule m(std::move(bad_stride));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "node 'conv2' (conv2d): attribute 'stride' is [0, 0], below the minimum 1");
  }
  Graph bad_dtype = build_model("lenet5");
  Node& conv2 = bad_dtype.node("conv2");
  conv2.params.set("bias", at::zeros({conv2.params.at("weight").size(0)}, at::kDouble));
  GraphModule m(std::move(bad_dtype));
  m->eval();
  try {
    m->forward(at::zeros({2, 1, 28, 28}));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_HAS(msg, "node 'conv2' (conv2d), inputs [2, 6, 14, 14]: ");
    EXPECT_HAS(msg, "ouble");
    EXPECT_EQ(msg.find("Exception raised from"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("frame #"), std::string::npos) << msg;
  }
}

// Item 15: what a path really is.
TEST(PathMessages, DescribePath) {
  const std::string dir = join_path(binary_dir(), "testdata/bad_input/paths");
  remove_tree(dir);
  make_directories(dir);
  write_file_atomic(join_path(dir, "empty"), "");
  write_file_atomic(join_path(dir, "three"), "abc");
  EXPECT_EQ(describe_path(dir), "a directory");
  EXPECT_EQ(describe_path(join_path(dir, "empty")), "an empty file");
  EXPECT_EQ(describe_path(join_path(dir, "three")), "a file of 3 bytes");
  EXPECT_EQ(describe_path(join_path(dir, "missing")), "missing");
  EXPECT_EQ(describe_path("/dev/null"), "a character device");
  EXPECT_NO_THROW(check_directory_creatable(join_path(dir, "new/deeper")));
  EXPECT_FALSE(path_exists(join_path(dir, "new")));
  try {
    check_directory_creatable(join_path(dir, "three/sub"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "three is a file of 3 bytes, not a folder");
  }
}

}  // namespace
}  // namespace whittle::runner
