// The recipe modifier `quantize`: the shipped recipes validate, a short BNN run trains with
// clipped latent weights and writes a packed checkpoint, bad settings name the key, and calibrated
// starts read the first training batches.

#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <iostream>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "export/checkpoint.h"
#include "fuse/fuse.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "graph/zoo.h"
#include "core/error.h"
#include "core/file_util.h"
#include "data/load.h"
#include "data/loader.h"
#include "quantize/calibrate.h"
#include "quantize/quantize.h"
#include "runner/modifier.h"
#include "runner/recipe.h"
#include "runner/trainer.h"
#include "support.h"

namespace whittle::test {
namespace {

// Recipe paths are relative to the directory whittle runs in: the project root.
class QuantizeRecipe : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::chdir(source_dir().c_str()), 0); }
};

// A ResNet-20 checkpoint in the test's output folder, for recipes that start from a run's.
std::string stand_in_checkpoint() {
  static const std::string path = [] {
    const std::string dir = join_path(binary_dir(), "testdata/quantize_recipe");
    make_directories(dir);
    const std::string p = join_path(dir, "resnet20_stand_in.h5");
    ZooOptions zoo;
    zoo.input_shape = {1, 3, 32, 32};
    save_checkpoint(p, build_model("resnet20", zoo));
    return p;
  }();
  return path;
}

TEST_F(QuantizeRecipe, ShippedRecipesValidate) {
  const std::string root = source_dir();
  for (const std::string dataset : {"mnist", "cifar10"}) {
    for (const auto& name : list_directory(join_path(root, "recipes/" + dataset))) {
      const std::string path = join_path(root, "recipes/" + dataset + "/" + name);
      if (dataset == "cifar10" && !path_exists(join_path(root, "../shared/data/cifar10-jpeg/cifar10-jpeg.tar.gz"))) {
        std::cout << "skipping " << path << ": CIFAR-10 archive absent\n";
        continue;
      }
      try {
        // The recipe's keys, then each modifier's own settings (its factory's checks). A recipe
        // that fine-tunes a run of another shipped recipe (`model: file: runs/...`, the budget
        // family) is checked with that run's checkpoint stood in for by a fresh one.
        const std::string text = read_file(path);
        std::vector<std::string> sets;
        if (text.find("model:\n  file: runs/") != std::string::npos) sets.push_back("model.file=" + stand_in_checkpoint());
        const runner::Recipe r = runner::load_recipe(path, sets);
        for (const auto& m : r.modifiers) runner::modifier_info(m.name).create(m);
      } catch (const std::exception& e) {
        ADD_FAILURE() << path << ": " << e.what();
      }
    }
  }
}

// A quantized recipe's header names the FP32 run it can start from (`model: {file:
// runs/<dataset>/<baseline>/model.h5}`); that baseline recipe must ship too.
TEST_F(QuantizeRecipe, QuantizedRecipesNameAShippedBaseline) {
  const std::string root = source_dir();
  int checked = 0;
  for (const std::string dataset : {"mnist", "cifar10"}) {
    for (const auto& name : list_directory(join_path(root, "recipes/" + dataset))) {
      const std::string text = read_file(join_path(root, "recipes/" + dataset + "/" + name));
      // In a comment (`model: {file: ...}`), or as the recipe's own model (the budget family
      // fine-tunes from `model:\n  file: runs/...`).
      for (const std::string& prefix : {"model: {file: runs/" + dataset + "/", "model:\n  file: runs/" + dataset + "/"}) {
        const auto at = text.find(prefix);
        if (at == std::string::npos) continue;
        const auto begin = at + prefix.size();
        const std::string baseline = text.substr(begin, text.find('/', begin) - begin);
        EXPECT_TRUE(path_exists(join_path(root, "recipes/" + dataset + "/" + baseline + ".yaml")))
            << dataset << "/" << name << " names the baseline " << baseline << ".yaml, which is not shipped";
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 27);  // 6 methods x (lenet5, resnet20, nin), and the 9 budget recipes
}

TEST_F(QuantizeRecipe, ShortBnnRunWritesPackedCheckpoint) {
  const std::string out = join_path(binary_dir(), "testdata/quantize/recipe_bnn");
  remove_tree(out);
  runner::Recipe r = runner::load_recipe(join_path(source_dir(), "recipes/mnist/lenet5_bnn.yaml"),
                                         {"training.epochs=1", "data.train_limit=512", "data.test_limit=200",
                                          "data.num_workers=1"});
  runner::RunOptions opt;
  opt.out_dir = out;
  std::ostringstream log;
  opt.log = &log;
  runner::RunResult res = runner::run_recipe(r, opt);
  EXPECT_EQ(res.epochs_done, 1) << log.str();  // accuracy: docs/results.md (full runs)
  Checkpoint ck = load_checkpoint(join_path(out, "model.h5"));
  for (const std::string layer : {"conv2", "fc1", "fc2"}) {
    const Node& n = ck.graph.node(layer);
    EXPECT_EQ(n.weight_transforms, std::vector<std::string>{"packed"}) << layer;
    EXPECT_EQ(n.attr_str("quant_method"), "bnn") << layer;
    EXPECT_EQ(n.attr_int("weight_bits"), 1) << layer;
    EXPECT_FALSE(n.params.contains("weight")) << layer;
  }
  EXPECT_EQ(ck.graph.node("relu1").op, "act_quant");
  EXPECT_TRUE(ck.graph.node("conv1").params.contains("weight"));
}

// The shipped LSQ W2A2 recipe, one short epoch: the activation steps start from the first batch
// (the log says so), train with the rest, and the packed checkpoint holds LSQ's uniform codes.
TEST_F(QuantizeRecipe, ShortLsqRunInitializesStepsAndPacksUniformCodes) {
  const std::string out = join_path(binary_dir(), "testdata/quantize/recipe_lsq");
  remove_tree(out);
  runner::Recipe r = runner::load_recipe(join_path(source_dir(), "recipes/mnist/lenet5_lsq_w2a2.yaml"),
                                         {"training.epochs=1", "data.train_limit=512", "data.test_limit=200",
                                          "data.num_workers=1"});
  runner::RunOptions opt;
  opt.out_dir = out;
  std::ostringstream log;
  opt.log = &log;
  runner::RunResult res = runner::run_recipe(r, opt);
  EXPECT_EQ(res.epochs_done, 1) << log.str();
  EXPECT_NE(log.str().find("3 activation quantizer(s) initialized from the first batch"), std::string::npos) << log.str();
  Checkpoint ck = load_checkpoint(join_path(out, "model.h5"));
  for (const std::string layer : {"conv2", "fc1", "fc2"}) {
    const Node& n = ck.graph.node(layer);
    EXPECT_EQ(n.attr_str("quant_method"), "lsq") << layer;
    EXPECT_EQ(n.attr_str("weight_encoding"), "uniform") << layer;
    EXPECT_EQ(n.attr_int("weight_bits"), 2) << layer;
  }
  int64_t steps = 0;
  for (const Node& n : ck.graph.nodes()) {
    if (n.op != "act_quant") continue;
    const double s = n.params.at("act_step").item<double>();
    EXPECT_GT(s, 0) << n.name;
    EXPECT_NE(s, 1 / std::sqrt(3.0)) << n.name << ": still the step before any data";
    ++steps;
  }
  EXPECT_EQ(steps, 3);
}

// Calibrated initialization through the trainer: PACT with clip_calibrator and LSQ with
// step_init observe the first init_batches training batches of the epoch, in the loader's order.
// The learning rate is too small to move a parameter, so the checkpoint holds the initial values;
// the reference calibrates the reloaded checkpoint, in training mode, on the loader's batches 0
// and 1 of epoch 0 (the 2,000 bundled t10k digits in batches of 1,000). LeNet-5's batch norms
// normalize with each batch's statistics in training mode, so other batches would give other
// values (one batch of all 2,000 digits moves conv2's clip by 0.6 %). Exact: both sides run the same
// forwards in one process, so the equality holds for any thread count and instruction set (checked
// with OMP_NUM_THREADS=1, ATEN_CPU_CAPABILITY=default and WHITTLE_KERNEL_ISA=scalar).
TEST_F(QuantizeRecipe, CalibratedStartsSeeTheFirstTrainingBatches) {
  data::LoadOptions split;
  split.split = "t10k";
  const data::Dataset digits = data::load_dataset("data/mnist10k", split);
  ASSERT_EQ(digits.size(), 2000);
  data::LoaderOptions batches;  // the trainer's: shuffled with the seed, 1,000 digits a batch
  batches.batch_size = 1000;
  batches.seed = 0;
  batches.num_workers = 0;
  batches.transform.mean = {0.1307};
  batches.transform.stddev = {0.3081};
  const data::DataLoader loader(digits, batches);
  ASSERT_EQ(loader.num_batches(), 2);
  for (const auto& [method, options, param] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"pact", "clip_calibrator: minmax", "act_clip"}, {"lsq", "step_init: mse", "act_step"}}) {
    SCOPED_TRACE(method);
    const std::string out = join_path(binary_dir(), "testdata/quantize/recipe_calibrated_" + method);
    remove_tree(out);
    const std::string text = R"(model: {name: lenet5}
data: {train: data/mnist10k, test: data/mnist10k, train_split: t10k, test_split: t10k, test_limit: 200,
       batch_size: 1000, mean: [0.1307], std: [0.3081], num_workers: 0}
training: {epochs: 1, optimizer: {name: sgd, lr: 1.0e-30, momentum: 0.9}}
modifiers:
  - {name: quantize, method: )" + method + ", weight_bits: 4, activation_bits: 4, " + options +
                             ", init_batches: 2}\n";
    runner::RunOptions opt;
    opt.out_dir = out;
    std::ostringstream log;
    opt.log = &log;
    const runner::RunResult res = runner::run_recipe(runner::parse_recipe(text, method + ".yaml", source_dir()), opt);
    EXPECT_EQ(res.epochs_done, 1) << log.str();
    const std::string calibrator = method == "pact" ? "minmax" : "mse";
    EXPECT_NE(log.str().find("3 activation quantizer(s) initialized by the " + calibrator + " calibrator over 2 batch(es)"),
              std::string::npos)
        << log.str();

    Checkpoint ck = load_checkpoint(join_path(out, "model.h5"));
    GraphModule m(std::move(ck.graph));
    std::map<std::string, float> trained;
    for (const Node& n : m->graph().nodes())
      if (n.op == "act_quant") trained[n.name] = n.params.at(param).item<float>();
    ASSERT_EQ(trained.size(), 3u);
    quantize::Calibration cal;
    cal.calibrator = calibrator;
    cal.batches = 2;
    m->train();
    EXPECT_EQ(quantize::calibrate_learned(m, [&](int64_t i) { return loader.batch(0, i).images; }, cal), 3);
    for (const Node& n : m->graph().nodes()) {
      if (n.op != "act_quant") continue;
      const float want = n.params.at(param).item<float>();
      EXPECT_EQ(trained.at(n.name), want) << n.name;
    }
  }
}

// Post-training int8 from a recipe (training.epochs 0): the batch norms fold first, the int8
// quantizers are calibrated by the entropy calibrator over the first two training batches with the
// evaluation transforms, in eval mode, and no optimizer step moves a weight. The reference does
// what `whittle calibrate` does to the same checkpoint in this process (fuse_for_inference,
// quantize::apply, calibrate_learned on the trainer's loader order), so every scale, zero point
// and weight is equal bit for bit; metrics.jsonl holds one line (epoch 0), report.json 0 epochs.
TEST_F(QuantizeRecipe, CalibrationOnlyRunIsPostTrainingQuantization) {
  const std::string dir = join_path(binary_dir(), "testdata/quantize_recipe");
  make_directories(dir);
  const std::string fp32 = join_path(dir, "lenet5_for_ptq.h5");
  {
    at::manual_seed(3);
    ZooOptions zoo;
    zoo.input_shape = {1, 1, 28, 28};
    GraphModule m(build_model("lenet5", zoo));
    // Batch-norm statistics away from 0 and 1, so that folding them matters.
    for (Node& n : m->graph().nodes())
      if (n.op == "batch_norm") {
        n.buffers.at("running_mean").uniform_(-0.5, 0.5);
        n.buffers.at("running_var").uniform_(0.5, 2.0);
      }
    save_checkpoint(fp32, m->graph());
  }
  const std::string out = join_path(dir, "ptq_run");
  remove_tree(out);
  const std::string text = "model: {file: " + fp32 + R"(}
data: {train: data/mnist10k, test: data/mnist10k, train_split: t10k, test_split: t10k, test_limit: 500,
       batch_size: 250, mean: [0.1307], std: [0.3081], num_workers: 0, random_crop_padding: 2}
training: {epochs: 0, seed: 5}
modifiers:
  - {name: fuse_batchnorm}
  - {name: quantize, method: int8, calibrator: entropy, calibration_batches: 2}
)";
  // The reference: the same checkpoint, folded (or not), quantized and calibrated as `whittle
  // calibrate` does, in eval mode, saved as a checkpoint (int8 codes and scales) and reloaded.
  data::LoadOptions split;
  split.split = "t10k";
  data::LoaderOptions batches;  // the trainer's order (seed 5), the evaluation transform (no crop)
  batches.batch_size = 250;
  batches.seed = 5;
  batches.num_workers = 0;
  batches.transform.mean = {0.1307};
  batches.transform.stddev = {0.3081};
  const data::DataLoader loader(data::load_dataset("data/mnist10k", split), batches);
  auto reference = [&](bool fold) {
    GraphModule ref(load_checkpoint(fp32).graph);
    ref->eval();
    if (fold) fuse::fuse_for_inference(ref);
    quantize::Config config;
    config.method = "int8";
    config.options["calibrator"] = SettingValue("entropy");
    config.options["calibration_batches"] = SettingValue(int64_t{2});
    config = quantize::resolve(config);
    const quantize::Report report = quantize::apply(ref, config);
    ref->eval();
    quantize::Calibration cal;
    cal.calibrator = "entropy";
    cal.batches = 2;
    at::NoGradGuard no_grad;
    EXPECT_GT(quantize::calibrate_learned(ref, [&](int64_t i) { return loader.batch(0, i).images; }, cal,
                                          quantize::nodes_to_initialize(ref->graph(), report)),
              0);
    const std::string path = join_path(dir, "lenet5_ptq_reference.h5");
    save_checkpoint(path, ref->graph());
    return load_checkpoint(path).graph;
  };
  // Every tensor of the run's checkpoint equals the reference's; returns the batch norms left.
  // Exact, with no margin, on any thread count and instruction set: the run and the reference make
  // the same forwards on the same batches in this one process, so whatever rounding a machine has,
  // both sides have it (checked with OMP_NUM_THREADS=1 and ATEN_CPU_CAPABILITY=default too).
  auto compare = [&](const Graph& want_graph) {
    const Graph got = load_checkpoint(join_path(out, "model.h5")).graph;
    int64_t act_quant = 0, batch_norms = 0;
    for (const Node& n : got.nodes()) {
      batch_norms += n.op == "batch_norm";
      act_quant += n.op == "act_quant";
      const Node& want = want_graph.node(n.name);
      for (const auto* tensors : {&n.params, &n.buffers})
        for (const auto& [name, t] : *tensors) {
          SCOPED_TRACE(n.name + "." + name);
          const at::Tensor& w = tensors == &n.params ? want.params.at(name) : want.buffers.at(name);
          EXPECT_TRUE(at::equal(t, w.to(t.dtype()))) << t << w;
        }
    }
    EXPECT_GE(act_quant, 3);
    EXPECT_EQ(got.nodes().size(), want_graph.nodes().size());
    return batch_norms;
  };

  runner::RunOptions opt;
  opt.out_dir = out;
  std::ostringstream log;
  opt.log = &log;
  const runner::RunResult res = runner::run_recipe(runner::parse_recipe(text, "ptq.yaml", source_dir()), opt);
  EXPECT_EQ(res.epochs_done, 0);
  EXPECT_NE(log.str().find("calibration only (training.epochs 0)"), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("training speed"), std::string::npos) << log.str();
  EXPECT_EQ(compare(reference(true)), 0);

  // metrics.jsonl: one line, epoch 0, the test figures of the saved model.
  const std::string metrics = read_file(join_path(out, "metrics.jsonl"));
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 1) << metrics;
  const nlohmann::json line = nlohmann::json::parse(metrics.substr(0, metrics.find('\n')));
  EXPECT_EQ(line.at("epoch").get<int64_t>(), 0);
  EXPECT_DOUBLE_EQ(line.at("test_top1").get<double>(), res.test.top1);
  const nlohmann::json rep = nlohmann::json::parse(read_file(join_path(out, "report.json")));
  EXPECT_EQ(rep.at("epochs").get<int64_t>(), 0);
  EXPECT_DOUBLE_EQ(rep.at("test_top1").get<double>(), res.test.top1);

  // Without the fold the batch norms stay, their statistics as they were, and the scales are those
  // of the eval-mode forward (in training mode each batch would normalize by its own statistics).
  std::string unfolded = text;
  unfolded.erase(unfolded.find("  - {name: fuse_batchnorm}\n"), std::string("  - {name: fuse_batchnorm}\n").size());
  opt.overwrite = true;
  runner::run_recipe(runner::parse_recipe(unfolded, "ptq.yaml", source_dir()), opt);
  EXPECT_EQ(compare(reference(false)), 4);  // LeNet-5's four batch norms
  const Graph before = load_checkpoint(fp32).graph;
  const Graph after = load_checkpoint(join_path(out, "model.h5")).graph;
  for (const Node& n : before.nodes()) {
    if (n.op != "batch_norm") continue;
    for (const char* stat : {"running_mean", "running_var"}) {
      EXPECT_TRUE(at::equal(after.node(n.name).buffers.at(stat), n.buffers.at(stat))) << n.name << "." << stat;
    }
  }
}

// What a run of 0 epochs cannot do is refused before anything is written, naming the entry: a
// modifier that needs training, a window after epoch 0, BN folding after the quantizers, --resume.
TEST_F(QuantizeRecipe, CalibrationOnlyRunRefusesWhatNeedsTraining) {
  const std::string out = join_path(binary_dir(), "testdata/quantize_recipe/ptq_refused");
  const std::string head = R"(model: {name: lenet5}
data: {train: data/mnist10k, test: data/mnist10k, test_split: t10k, train_limit: 64, test_limit: 64, batch_size: 32}
training: {epochs: 0}
modifiers:
)";
  const std::string quantize = "  - {name: quantize, method: int8, calibration_batches: 1}\n";
  for (const auto& [entries, want] : std::vector<std::pair<std::string, std::string>>{
           {quantize + "  - {name: distill, teacher: lenet5, method: [kd]}\n",
            "modifiers.1: modifier 'distill' needs training (it acts on the training loss or the optimizer steps), and "
            "training.epochs is 0 (calibration only)"},
           {"  - {name: fuse_batchnorm, mode: qat}\n" + quantize,
            "modifier 'fuse_batchnorm' needs training (mode qat simulates the folding while training"},
           {"  - {name: prune, sparsity: 0.5, schedule: agp, end_epoch: 1}\n",
            "modifiers.0: modifier 'prune' needs training (schedule 'agp' prunes in steps over the training)"},
           {"  - {name: quantize, method: int8, start_epoch: 0.5}\n",
            "start_epoch 0.5: training.epochs is 0 (calibration only), so every modifier applies at epoch 0"},
           {quantize + "  - {name: fuse_batchnorm}\n",
            "must come before the 'quantize' modifier (line 5)"}}) {
    SCOPED_TRACE(entries);
    const std::string modifiers = entries;  // (a lambda cannot capture a structured binding in C++17)
    remove_tree(out);
    runner::RunOptions opt;
    opt.out_dir = out;
    std::ostringstream log;
    opt.log = &log;
    const std::string msg = usage_error_message(
        [&] { runner::run_recipe(runner::parse_recipe(head + modifiers, "ptq.yaml", source_dir()), opt); });
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_FALSE(path_exists(out)) << log.str();
  }
  // When --set made the run calibration only (the key itself, or its section), the refusal says so.
  std::string trained = head;
  trained.replace(trained.find("{epochs: 0}"), 11, "{epochs: 2}");
  for (const auto& [entries, set] : std::vector<std::pair<std::string, std::string>>{
           {quantize + "  - {name: distill, teacher: lenet5, method: [kd]}\n", "training.epochs=0"},
           {quantize + "  - {name: distill, teacher: lenet5, method: [kd]}\n", "training={epochs: 0}"},
           {"  - {name: quantize, method: int8, start_epoch: 0.5}\n", "training.epochs=0"}}) {
    SCOPED_TRACE(set + " " + entries);
    const std::string modifiers = entries, assignment = set;
    remove_tree(out);
    runner::RunOptions opt;
    opt.out_dir = out;
    std::ostringstream log;
    opt.log = &log;
    const std::string msg = usage_error_message([&] {
      runner::run_recipe(runner::parse_recipe(trained + modifiers, "ptq.yaml", source_dir(), {assignment}), opt);
    });
    EXPECT_NE(msg.find("training.epochs is 0 (calibration only, with --set)"), std::string::npos) << msg;
    EXPECT_FALSE(path_exists(out));
  }
  // PACT without a calibrator: its clips keep clip_init in a run of 0 epochs, which the log says;
  // with clip_calibrator they come from data, and nothing is said.
  for (const bool calibrated : {false, true}) {
    remove_tree(out);
    runner::RunOptions opt;
    opt.out_dir = out;
    std::ostringstream log;
    opt.log = &log;
    runner::run_recipe(
        runner::parse_recipe(head + "  - {name: quantize, method: pact, weight_bits: 4, activation_bits: 4" +
                                 (calibrated ? ", clip_calibrator: mse" : "") + "}\n",
                             "ptq.yaml", source_dir()),
        opt);
    const bool noted = log.str().find("modifiers.0: method 'pact' learns its activation parameters (act_clip) in "
                                      "training; without a calibrator they keep their initial values") != std::string::npos;
    EXPECT_EQ(noted, !calibrated) << log.str();
  }
  // A one-shot prune runs without training, in list order: by the BN scales, before the batch
  // norms fold.
  remove_tree(out);
  runner::RunOptions opt;
  opt.out_dir = out;
  std::ostringstream log;
  opt.log = &log;
  const runner::RunResult res = runner::run_recipe(
      runner::parse_recipe(head + "  - {name: prune, sparsity: 0.5, schedule: one_shot, criterion: bn_scale}\n" +
                               "  - {name: fuse_batchnorm}\n" + quantize,
                           "ptq.yaml", source_dir()),
      opt);
  EXPECT_EQ(res.epochs_done, 0);
  EXPECT_NE(log.str().find("prune step 1/1 at epoch 0"), std::string::npos) << log.str();
  ZooOptions zoo;
  zoo.input_shape = {1, 1, 28, 28};
  EXPECT_LT(res.macs, graph_cost(build_model("lenet5", zoo)).macs);
  // --resume: a finished calibration has nothing to resume (as a finished training run); an
  // unfinished one (no report.json) is refused, a calibration saving no training state.
  opt.resume = true;
  const std::string recipe = head + "  - {name: prune, sparsity: 0.5, schedule: one_shot, criterion: bn_scale}\n" +
                             "  - {name: fuse_batchnorm}\n" + quantize;
  const runner::RunResult again = runner::run_recipe(runner::parse_recipe(recipe, "ptq.yaml", source_dir()), opt);
  EXPECT_TRUE(again.finished_before);
  EXPECT_DOUBLE_EQ(again.test.top1, res.test.top1);
  remove_file(join_path(out, "report.json"));
  const std::string msg =
      usage_error_message([&] { runner::run_recipe(runner::parse_recipe(recipe, "ptq.yaml", source_dir()), opt); });
  EXPECT_NE(msg.find("--resume: training.epochs is 0 (calibration only), which saves no training state"),
            std::string::npos)
      << msg;

  // More calibration batches than the split has: refused, not counted twice.
  remove_tree(out);
  opt.resume = false;
  const std::string many = usage_error_message([&] {
    runner::run_recipe(
        runner::parse_recipe(head + "  - {name: quantize, method: int8, calibration_batches: 3}\n", "ptq.yaml", source_dir()),
        opt);
  });
  EXPECT_NE(many.find("ptq.yaml:5, modifiers.0: modifier 'quantize': its minmax calibrator reads 3 batches, but the "
                      "training split has 2 of 32 images"),
            std::string::npos)
      << many;
  EXPECT_FALSE(path_exists(out));
}

// Progressive bit widths in a recipe: LSQ W4A4 for the first epoch, then a second entry on the
// same layers lowers them to W2A2, carrying the steps; the checkpoint is 2-bit. Two DoReFa entries
// on the same layers stay refused (no progressive form).
TEST_F(QuantizeRecipe, LsqStagesLowerTheBits) {
  const std::string out = join_path(binary_dir(), "testdata/quantize/recipe_lsq_stages");
  remove_tree(out);
  const std::string text = R"(model: {name: lenet5}
data: {train: data/mnist10k, test: data/mnist10k, test_split: t10k, train_limit: 256, test_limit: 64, batch_size: 32, num_workers: 0}
training: {epochs: 2}
modifiers:
  - {name: quantize, method: lsq, weight_bits: 4, activation_bits: 4}
  - {name: quantize, method: lsq, weight_bits: 2, activation_bits: 2, start_epoch: 1}
)";
  runner::RunOptions opt;
  opt.out_dir = out;
  std::ostringstream log;
  opt.log = &log;
  const runner::RunResult res = runner::run_recipe(runner::parse_recipe(text, "stages.yaml", source_dir()), opt);
  EXPECT_EQ(res.epochs_done, 2) << log.str();
  EXPECT_NE(log.str().find("quantize (lsq): 3 layers now W2A2, their learned parameters carried"), std::string::npos) << log.str();
  const Checkpoint ck = load_checkpoint(join_path(out, "model.h5"));
  for (const std::string layer : {"conv2", "fc1", "fc2"}) EXPECT_EQ(ck.graph.node(layer).attr_int("weight_bits"), 2) << layer;
  for (const Node& n : ck.graph.nodes()) {
    if (n.op == "act_quant") {
      EXPECT_EQ(n.attr_int("activation_bits"), 2) << n.name;
    }
  }

  std::string dorefa = text;
  for (const std::string from : {"method: lsq, weight_bits: 4", "method: lsq, weight_bits: 2"})
    dorefa.replace(dorefa.find(from), from.size(), "method: dorefa, weight_bits: " + from.substr(from.size() - 1));
  remove_tree(out);
  try {
    runner::run_recipe(runner::parse_recipe(dorefa, "stages.yaml", source_dir()), opt);
    FAIL() << "two dorefa entries on one layer ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already quantizes"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("as a later stage"), std::string::npos) << e.what();  // DoReFa has none
  }

  // A later LSQ entry whose settings differ from the first's is no stage: the refusal says what a
  // stage needs (it used to say only "give the entries disjoint targets").
  std::string other = text;
  const std::string first = "weight_bits: 4, activation_bits: 4}";
  other.replace(other.find(first), first.size(), "weight_bits: 4, activation_bits: 4, step_init: mse, init_batches: 2}");
  remove_tree(out);
  const std::string msg = usage_error_message([&] { runner::run_recipe(runner::parse_recipe(other, "stages.yaml", source_dir()), opt); });
  EXPECT_NE(msg.find("already quantizes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("as a later stage of progressive bit widths it needs the same settings (that entry: "
                     "init_batches 2, step_init mse; this one: the defaults)"), std::string::npos) << msg;
}

TEST_F(QuantizeRecipe, BadSettingsNameTheKey) {
  const std::string text = R"(model: {name: lenet5}
data: {train: data/mnist10k, test: data/mnist10k, test_split: t10k}
training: {epochs: 1}
modifiers:
  - name: quantize
    method: bnn
    weigth_bits: 1
)";
  try {
    runner::parse_recipe(text, "inline.yaml", source_dir());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weigth_bits"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("weight_bits"), std::string::npos) << e.what();
  }
}

// Two quantize entries on the same layers are refused before the first epoch, naming both entries
// and the layers (they used to pass validation, train an epoch, then fail blaming "first or last
// layer", and fail so on every --resume). Entries with disjoint targets run.
TEST_F(QuantizeRecipe, TwoEntriesOnOneLayerAreRefusedBeforeTraining) {
  const std::string out = join_path(binary_dir(), "testdata/quantize/recipe_two_entries");
  remove_tree(out);
  const std::string text = R"(model: {name: lenet5}
data: {train: data/mnist10k, test: data/mnist10k, test_split: t10k, train_limit: 64, test_limit: 64, batch_size: 32}
training: {epochs: 2, threads: 1}
modifiers:
  - name: quantize
    method: dorefa
    weight_bits: 2
    activation_bits: 2
  - name: quantize
    method: dorefa
    weight_bits: 4
    start_epoch: 1
)";
  runner::RunOptions opt;
  opt.out_dir = out;
  std::ostringstream log;
  opt.log = &log;
  const std::string msg = usage_error_message([&] { runner::run_recipe(runner::parse_recipe(text, "two.yaml", source_dir()), opt); });
  EXPECT_NE(msg.find("modifiers.1: modifier 'quantize' selects conv2, fc1, fc2, which two.yaml:5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("already quantizes"), std::string::npos) << msg;
  EXPECT_FALSE(path_exists(join_path(out, "model.h5"))) << "trained before refusing: " << log.str();
  EXPECT_FALSE(path_exists(join_path(out, "metrics.jsonl")));

  // The second entry on the first layer only (named, so quantized): no layer is shared.
  const std::string start = "    start_epoch: 1\n";
  std::string disjoint = text;
  disjoint.replace(disjoint.find(start), start.size(), "    targets: [conv1]\n");
  disjoint.replace(disjoint.find("epochs: 2"), 9, "epochs: 1");
  remove_tree(out);
  runner::RunResult res = runner::run_recipe(runner::parse_recipe(disjoint, "two.yaml", source_dir()), opt);
  EXPECT_EQ(res.epochs_done, 1);
  Checkpoint ck = load_checkpoint(join_path(out, "model.h5"));
  EXPECT_EQ(ck.graph.node("conv1").attr_int("weight_bits"), 4);
  EXPECT_EQ(ck.graph.node("conv2").attr_int("weight_bits"), 2);

  // An entry whose every layer is skipped is refused before training too, not at its epoch.
  std::string none = text;
  none.replace(none.find(start), start.size(), "    start_epoch: 1\n    targets: [relu1]\n");
  remove_tree(out);
  const std::string none_msg =
      usage_error_message([&] { runner::run_recipe(runner::parse_recipe(none, "none.yaml", source_dir()), opt); });
  EXPECT_NE(none_msg.find("modifiers.1: modifier 'quantize' quantizes no layer: its targets select no conv or linear layer"),
            std::string::npos) << none_msg;
  EXPECT_FALSE(path_exists(join_path(out, "model.h5"))) << none_msg;
}

}  // namespace
}  // namespace whittle::test
