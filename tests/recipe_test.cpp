// Recipe parsing and validation: defaults, overrides, and errors that name file, line and key.

#include "core/error.h"
#include "runner/modifier.h"
#include "runner/recipe.h"
#include "support.h"

namespace whittle::runner {
namespace {

// Parsing only checks that data paths exist; tests run from the build tree, so recipes here use an
// absolute path that always exists.
std::string mnist() { return test::source_dir() + "/tests"; }

std::string base_recipe() {
  return "model:\n"
         "  name: lenet5\n"
         "data:\n"
         "  train: " + mnist() + "\n"
         "  test: " + mnist() + "\n"
         "  batch_size: 64\n"
         "training:\n"
         "  epochs: 3\n"
         "  optimizer: {name: sgd, lr: 0.05, momentum: 0.9, nesterov: true}\n"
         "  lr_schedule: {name: cosine}\n";
}

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_recipe(text, "r.yaml", ".", overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  return "no error";
}

class RecipeTest : public test::SeededTest {
 protected:
  void SetUp() override {
    test::SeededTest::SetUp();
    ModifierInfo info;
    info.name = "test_noop";
    info.description = "does nothing (tests)";
    info.settings = {KeySpec{"weight_bits", KeyType::kInt, "32", "bits", {}, {}}};
    info.create = [](const ModifierSpec& s) { return std::make_unique<Modifier>(s); };
    register_modifier(info);
  }
};

TEST_F(RecipeTest, ParsesValuesAndDefaults) {
  Recipe r = parse_recipe(base_recipe(), "recipes/mnist/lenet5.yaml", ".");
  EXPECT_EQ(r.model.name, "lenet5");
  EXPECT_EQ(r.model.num_classes, 10);
  EXPECT_EQ(r.data.batch_size, 64);
  EXPECT_EQ(r.data.eval_batch_size, 500);
  EXPECT_EQ(r.training.epochs, 3);
  EXPECT_EQ(r.training.optimizer.name, "sgd");
  EXPECT_DOUBLE_EQ(r.training.optimizer.lr, 0.05);
  EXPECT_TRUE(r.training.optimizer.nesterov);
  EXPECT_EQ(r.training.lr_schedule.name, "cosine");
  EXPECT_EQ(r.outputs.dir, "runs/lenet5");
  EXPECT_EQ(r.outputs.checkpoint, "model.h5");
  EXPECT_EQ(r.text, base_recipe());
}

// training.activation_checkpointing: a list of node-name prefixes, or one name; off by default.
TEST_F(RecipeTest, ActivationCheckpointingSegments) {
  EXPECT_TRUE(parse_recipe(base_recipe(), "r.yaml", ".").training.activation_checkpointing.empty());
  Recipe r = parse_recipe(base_recipe(), "r.yaml", ".", {"training.activation_checkpointing=[conv2, fc1]"});
  EXPECT_EQ(r.training.activation_checkpointing, (std::vector<std::string>{"conv2", "fc1"}));
  r = parse_recipe(base_recipe() + "  activation_checkpointing: conv1\n", "r.yaml", ".");
  EXPECT_EQ(r.training.activation_checkpointing, std::vector<std::string>{"conv1"});
  EXPECT_NE(error_of(base_recipe() + "  activation_checkpointing: {a: 1}\n").find("activation_checkpointing"), std::string::npos);
}

TEST_F(RecipeTest, UnknownKeyNamesLineAndClosestKey) {
  std::string text = base_recipe() + "trainng:\n  epochs: 2\n";
  std::string msg = error_of(text);
  EXPECT_NE(msg.find("r.yaml:11: unknown key 'trainng'; did you mean 'training'?"), std::string::npos) << msg;
  msg = error_of(base_recipe() + "  momentun: 0.9\n");
  EXPECT_NE(msg.find("unknown key 'training.momentun'"), std::string::npos) << msg;
  msg = error_of(base_recipe() + "  lr_schedul: {name: step}\n");
  EXPECT_NE(msg.find("did you mean 'lr_schedule'?"), std::string::npos) << msg;
}

TEST_F(RecipeTest, WrongTypesAndChoicesAreNamed) {
  std::string msg = error_of(base_recipe(), {"training.epochs=three"});
  EXPECT_NE(msg.find("'training.epochs' must be an integer, got 'three'"), std::string::npos) << msg;
  msg = error_of(base_recipe(), {"training.optimizer.name=sgdd"});
  EXPECT_NE(msg.find("did you mean 'sgd'?"), std::string::npos) << msg;
  msg = error_of(base_recipe(), {"data.mean=0.5"});
  EXPECT_NE(msg.find("'data.mean' must be a list of numbers"), std::string::npos) << msg;
  msg = error_of(base_recipe(), {"data.horizontal_flip=maybe"});
  EXPECT_NE(msg.find("'data.horizontal_flip' must be a boolean"), std::string::npos) << msg;
  // Found by fuzz_recipe (tests/fuzz/regressions/recipe/): "09" passed the integer check, then
  // yaml-cpp's conversion (a bad octal) threw YAML::TypedBadConversion out of the parser.
  msg = error_of(base_recipe(), {"training.epochs=09"});
  EXPECT_NE(msg.find("'training.epochs' must be an integer, got '09'"), std::string::npos) << msg;
}

TEST_F(RecipeTest, MissingDataPathIsNamed) {
  std::string msg = error_of(base_recipe(), {"data.train=/no/such/dir"});
  EXPECT_NE(msg.find("'data.train': /no/such/dir does not exist"), std::string::npos) << msg;
}

TEST_F(RecipeTest, OverridesReachEveryLevel) {
  Recipe r = parse_recipe(base_recipe() + "modifiers:\n  - name: test_noop\n    weight_bits: 4\n", "r.yaml", ".",
                          {"training.epochs=7", "data.mean=[0.5]", "data.std=[0.25]", "modifiers.0.weight_bits=2",
                           "outputs.dir=/tmp/x"});
  EXPECT_EQ(r.training.epochs, 7);
  EXPECT_EQ(r.data.mean, std::vector<double>{0.5});
  ASSERT_EQ(r.modifiers.size(), 1u);
  EXPECT_EQ(r.modifiers[0].settings["weight_bits"].as<int>(), 2);
  EXPECT_EQ(r.outputs.dir, "/tmp/x");
  // The effective text records the overrides and parses back to the same values.
  Recipe again = parse_recipe(r.text, "again.yaml", ".");
  EXPECT_EQ(again.training.epochs, 7);
  EXPECT_EQ(again.modifiers[0].settings["weight_bits"].as<int>(), 2);
  EXPECT_NE(error_of(base_recipe(), {"modifiers.3.x=1"}).find("--set"), std::string::npos);
  EXPECT_NE(error_of(base_recipe(), {"training"}).find("expected path.to.key=value"), std::string::npos);
}

// `--set` changes the path it names, not every YAML alias of that node: with `mean: &m [0.5]` and
// `std: *m`, setting the mean left std at the new mean (and saved `mean: &1 [...] / std: *1`).
TEST_F(RecipeTest, OverrideOfAnAliasedNodeChangesThatPathOnly) {
  const std::string aliased = "model: {name: lenet5}\n"
                              "data:\n"
                              "  train: " + mnist() + "\n"
                              "  test: " + mnist() + "\n"
                              "  mean: &m [0.5]\n"
                              "  std: *m\n"
                              "training:\n"
                              "  epochs: &e 3\n"
                              "  optimizer: {name: sgd, lr: &lr 0.05, momentum: 0.9}\n"
                              "  lr_schedule: {name: one_cycle, max_lr: *lr}\n"
                              "modifiers:\n"
                              "  - &q {name: test_noop, weight_bits: 4}\n"
                              "  - *q\n";
  Recipe plain = parse_recipe(aliased, "r.yaml", ".");
  EXPECT_EQ(plain.data.std, std::vector<double>{0.5});
  EXPECT_DOUBLE_EQ(plain.training.lr_schedule.max_lr, 0.05);
  Recipe r = parse_recipe(aliased, "r.yaml", ".",
                          {"data.mean=[0.1307]", "training.optimizer.lr=0.1", "modifiers.1.weight_bits=2"});
  EXPECT_EQ(r.data.mean, std::vector<double>{0.1307});
  EXPECT_EQ(r.data.std, std::vector<double>{0.5});
  EXPECT_DOUBLE_EQ(r.training.optimizer.lr, 0.1);
  EXPECT_DOUBLE_EQ(r.training.lr_schedule.max_lr, 0.05);
  ASSERT_EQ(r.modifiers.size(), 2u);
  EXPECT_EQ(r.modifiers[0].settings["weight_bits"].as<int>(), 4);
  EXPECT_EQ(r.modifiers[1].settings["weight_bits"].as<int>(), 2);
  // The saved text says the same: no alias ties the set path to the others.
  Recipe again = parse_recipe(r.text, "again.yaml", ".");
  EXPECT_EQ(again.data.mean, std::vector<double>{0.1307});
  EXPECT_EQ(again.data.std, std::vector<double>{0.5});
  EXPECT_DOUBLE_EQ(again.training.lr_schedule.max_lr, 0.05);
  EXPECT_EQ(again.modifiers[0].settings["weight_bits"].as<int>(), 4);
  // Setting the other alias, and a whole aliased entry, likewise.
  Recipe s = parse_recipe(aliased, "r.yaml", ".", {"data.std=[0.3081]", "modifiers.0={name: test_noop, weight_bits: 8}"});
  EXPECT_EQ(s.data.mean, std::vector<double>{0.5});
  EXPECT_EQ(s.data.std, std::vector<double>{0.3081});
  EXPECT_EQ(s.modifiers[0].settings["weight_bits"].as<int>(), 8);
  EXPECT_EQ(s.modifiers[1].settings["weight_bits"].as<int>(), 4);
  // An entry inside an aliased list.
  Recipe t = parse_recipe(aliased, "r.yaml", ".", {"data.mean.0=0.25"});
  EXPECT_EQ(t.data.mean, std::vector<double>{0.25});
  EXPECT_EQ(t.data.std, std::vector<double>{0.5});
  // Aliases no --set touches keep working.
  EXPECT_EQ(t.training.epochs, 3);
}

// `--set model.file=...` replaces the recipe's zoo `model.name` (fine-tuning from a checkpoint)
// and the reverse; setting both on the command line is an error.
TEST_F(RecipeTest, ModelFileOverrideReplacesZooName) {
  const std::string file = test::source_dir() + "/tests/recipe_test.cpp";
  Recipe r = parse_recipe(base_recipe(), "r.yaml", ".", {"model.file=" + file});
  EXPECT_EQ(r.model.name, "");
  EXPECT_EQ(r.model.file, file);
  Recipe back = parse_recipe(r.text, "again.yaml", ".", {"model.name=vgg_small"});
  EXPECT_EQ(back.model.name, "vgg_small");
  EXPECT_EQ(back.model.file, "");
  const std::string msg = error_of(base_recipe(), {"model.file=" + file, "model.name=lenet5"});
  EXPECT_NE(msg.find("--set model.file and --set model.name both given"), std::string::npos) << msg;
}

TEST_F(RecipeTest, ModifiersAreValidatedAgainstTheirSchema) {
  Recipe r = parse_recipe(base_recipe() +
                              "modifiers:\n  - name: test_noop\n    start_epoch: 1\n    end_epoch: 2.5\n"
                              "    targets: [conv2d, re:fc.*]\n    ignore: conv1\n",
                          "r.yaml", ".");
  ASSERT_EQ(r.modifiers.size(), 1u);
  EXPECT_EQ(r.modifiers[0].line, 12);
  EXPECT_DOUBLE_EQ(r.modifiers[0].end_epoch, 2.5);
  EXPECT_EQ(r.modifiers[0].targets, (std::vector<std::string>{"conv2d", "re:fc.*"}));
  EXPECT_EQ(r.modifiers[0].ignore, std::vector<std::string>{"conv1"});
  std::string msg = error_of(base_recipe() + "modifiers:\n  - name: quantise\n");
  EXPECT_NE(msg.find("r.yaml:12: 'modifiers.0.name': unknown modifier 'quantise' (known modifiers:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("test_noop"), std::string::npos) << msg;
  msg = error_of(base_recipe() + "modifiers:\n  - name: test_noop\n    weight_bit: 4\n");
  EXPECT_NE(msg.find("r.yaml:13: unknown key 'modifiers.0.weight_bit'; did you mean 'weight_bits'? (valid keys in "
                     "'modifiers.0' (test_noop): name, start_epoch"),
            std::string::npos)
      << msg;
  msg = error_of(base_recipe() + "modifiers:\n  - name: test_noop\n    start_epoch: 3\n    end_epoch: 1\n");
  EXPECT_NE(msg.find("end_epoch 1 is not after start_epoch 3"), std::string::npos) << msg;
}

TEST_F(RecipeTest, StructuralProblems) {
  EXPECT_NE(error_of("").find("the recipe is empty"), std::string::npos);
  EXPECT_NE(error_of("model: [1, 2\n").find("not valid YAML"), std::string::npos);
  EXPECT_NE(error_of("model: {name: lenet5}\n").find("missing section 'data'"), std::string::npos);
  std::string both = base_recipe() + "";
  both.replace(both.find("  name: lenet5\n"), 15, "  name: lenet5\n  file: x.pt\n");
  EXPECT_NE(error_of(both).find("exactly one of 'name'"), std::string::npos);
}

// A run directory's recipe.yaml read for `whittle report`: the modifiers section alone, each entry
// checked as parse_recipe checks it, with paths that need not exist on this machine.
TEST_F(RecipeTest, ModifiersOfARunDirectoryRecipeAndTheirLabels) {
  const std::string text =
      "model: {file: /elsewhere/model.h5}\n"
      "data: {train: /elsewhere/data, test: /elsewhere/data}\n"
      "training: {epochs: 4}\n"
      "modifiers:\n"
      "  - {name: quantize, method: dorefa, weight_bits: 2, activation_bits: 2}\n"
      "  - {name: prune, criterion: fpgm, target_macs: 0.5}\n"
      "  - {name: prune, sparsity: 0.3}\n"
      "  - {name: quantize, method: bnn}\n"
      "  - {name: test_noop}\n";
  const std::vector<ModifierSpec> mods = parse_recipe_modifiers(text, "run/recipe.yaml");
  ASSERT_EQ(mods.size(), 5u);
  EXPECT_EQ(modifier_label(mods[0]), "DoReFa W2A2");
  EXPECT_EQ(modifier_label(mods[1]), "pruned FPGM (50 % MACs)");
  EXPECT_EQ(modifier_label(mods[2]), "pruned L1 (sparsity 0.3)");
  EXPECT_EQ(modifier_label(mods[3]), "BNN");
  EXPECT_EQ(modifier_label(mods[4]), "test_noop");  // no label: its name
  EXPECT_TRUE(parse_recipe_modifiers("model: {name: lenet5}\n", "r.yaml").empty());
  // What parse_recipe refuses in the section is refused here too, naming the line.
  try {
    parse_recipe_modifiers("training: {epochs: 2}\nmodifiers:\n  - {name: prune, sparsty: 0.3}\n", "r.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("r.yaml:3: unknown key 'modifiers.0.sparsty'"), std::string::npos) << e.what();
  }
  try {
    parse_recipe_modifiers("training: {epochs: 2}\nmodifiers:\n  - {name: prune, start_epoch: 3}\n", "r.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("start_epoch 3 is not inside the run of 2 epoch(s)"), std::string::npos) << e.what();
  }
}

TEST(ClosestMatch, PicksNearWordsOnly) {
  EXPECT_EQ(closest_match("trainng", {"model", "data", "training"}), "training");
  EXPECT_EQ(closest_match("batchsize", {"batch_size", "eval_batch_size"}), "batch_size");
  EXPECT_EQ(closest_match("zzzzzz", {"model", "data"}), "");
}

}  // namespace
}  // namespace whittle::runner
