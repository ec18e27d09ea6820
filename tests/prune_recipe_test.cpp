// The `prune` and `bn_sparsity` recipe modifiers: schedules by hand, a run whose checkpoint holds
// the pruned shapes (rebuilt by load_checkpoint without the recipe), an iterative schedule
// reaching the final widths without rounding drift, resuming after a pruning step, and errors.

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "export/checkpoint.h"
#include "fuse/qat_batchnorm.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "runner/modifier.h"
#include "runner/optimizer.h"
#include "runner/prune_modifier.h"
#include "runner/recipe.h"
#include "runner/trainer.h"
#include "recipe_support.h"
#include "support.h"

namespace whittle::runner {
namespace {

using test::binary_dir;
using test::source_dir;

std::string fresh_dir(const std::string& name) { return test::fresh_dir("prune_recipe/" + name); }

// LeNet-5 on 256 training images in batches of 32 (8 steps an epoch).
Recipe recipe(int epochs, const std::string& modifiers) { return test::lenet5_quick_recipe(epochs, modifiers); }

int64_t out_channels(const Graph& g, const std::string& node) { return g.node(node).params.at("weight").size(0); }

// Run options writing into `dir`, the progress into `log`.
RunOptions options(const std::string& dir, std::ostringstream& log) {
  RunOptions o;
  o.out_dir = dir;
  o.log = &log;
  return o;
}

TEST(PruneSchedule, FractionsByHand) {
  // AGP with s_i = 0, s_f = 0.5, 4 steps: 0.5 − 0.5·(1 − k/4)³.
  EXPECT_DOUBLE_EQ(scheduled_fraction("agp", 1, 4, 0.0, 0.5), 0.5 - 0.5 * 0.421875);
  EXPECT_DOUBLE_EQ(scheduled_fraction("agp", 2, 4, 0.0, 0.5), 0.4375);
  EXPECT_DOUBLE_EQ(scheduled_fraction("agp", 3, 4, 0.0, 0.5), 0.4921875);
  EXPECT_DOUBLE_EQ(scheduled_fraction("agp", 4, 4, 0.0, 0.5), 0.5);
  EXPECT_DOUBLE_EQ(scheduled_fraction("iterative", 1, 4, 0.0, 0.5), 0.125);
  EXPECT_DOUBLE_EQ(scheduled_fraction("iterative", 3, 4, 0.0, 0.5), 0.375);
  EXPECT_DOUBLE_EQ(scheduled_fraction("one_shot", 1, 1, 0.0, 0.5), 0.5);
}

// One-shot at half the MACs: the checkpoint holds the smaller tensors and loads on its own.
TEST(PruneModifier, OneShotCheckpointHoldsThePrunedShapes) {
  const std::string dir = fresh_dir("one_shot");
  std::ostringstream log;
  RunOptions o = options(dir, log);
  const RunResult res = run_recipe(recipe(1, "  - {name: prune, criterion: l1, target_macs: 0.5}\n"), o);
  EXPECT_EQ(res.epochs_done, 1) << log.str();
  EXPECT_LE(res.macs, 416520 / 2) << log.str();  // the report describes the pruned model
  const Checkpoint c = load_checkpoint(join_path(dir, "model.h5"));
  EXPECT_LT(out_channels(c.graph, "conv2"), 16);
  EXPECT_EQ(c.graph.node("fc3").params.at("weight").size(0), 10);
  GraphModule m(c.graph.clone());
  m->eval();
  EXPECT_EQ(m->forward(at::zeros({2, 1, 28, 28})).sizes(), (at::IntArrayRef{2, 10}));
}

// Iterative, 4 steps at epochs 0, 0.5, 1, 1.5 to sparsity 0.5: every layer ends at C₀ − ⌊C₀/2⌋
// (conv1 6 → 3, conv2 16 → 8, fc1 120 → 60, fc2 84 → 42), with no drift from the steps' rounding.
TEST(PruneModifier, IterativeReachesTheFinalWidths) {
  const std::string dir = fresh_dir("iterative");
  const Recipe r = recipe(3, "  - {name: prune, sparsity: 0.5, schedule: iterative, end_epoch: 2, update_frequency: 0.5}\n");
  std::ostringstream log;
  RunOptions o = options(dir, log);
  Trainer tr(r, o);
  ASSERT_TRUE(tr.train_epoch());
  tr.end_epoch();
  // After epoch 1: steps 1 (0.125) and 2 (0.25) done: conv2 16 − 4 = 12.
  EXPECT_EQ(out_channels(tr.model()->graph(), "conv2"), 12) << log.str();
  const RunResult res = tr.run();
  EXPECT_EQ(res.epochs_done, 3);
  const Graph& g = tr.model()->graph();
  EXPECT_EQ(out_channels(g, "conv1"), 3);
  EXPECT_EQ(out_channels(g, "conv2"), 8);
  EXPECT_EQ(out_channels(g, "fc1"), 60);
  EXPECT_EQ(out_channels(g, "fc2"), 42);
  EXPECT_NE(tr.modifiers()[0]->state().find(R"("steps_done":4)"), std::string::npos) << tr.modifiers()[0]->state();
}

// Resuming after a pruning step rebuilds the pruned model from the training state and does not
// prune again.
TEST(PruneModifier, ResumeKeepsThePrunedModel) {
  const std::string dir = fresh_dir("resume");
  const Recipe r = recipe(2, "  - {name: prune, sparsity: 0.5}\n");
  std::ostringstream log;
  RunOptions o = options(dir, log);
  {
    Trainer tr(r, o);
    ASSERT_TRUE(tr.train_epoch());
    tr.end_epoch();
    EXPECT_EQ(out_channels(tr.model()->graph(), "conv2"), 8);
  }
  o.resume = true;
  Trainer again(r, o);
  EXPECT_EQ(out_channels(again.model()->graph(), "conv2"), 8);
  again.run();
  EXPECT_EQ(out_channels(again.model()->graph(), "conv2"), 8);
}

TEST(PruneModifier, SettingsAreChecked) {
  auto error_of = [](const std::string& modifiers) {
    try {
      const Recipe r = recipe(2, modifiers);
      modifier_info(r.modifiers[0].name).create(r.modifiers[0]);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("  - {name: prune, schedule: agp}\n").find("give end_epoch"), std::string::npos);
  EXPECT_NE(error_of("  - {name: prune, sparsity: 1.0}\n").find("'modifiers.0.sparsity' is 1"), std::string::npos);
  EXPECT_NE(error_of("  - {name: prune, target_macs: 0.5, target_params: 0.5}\n").find("not both"), std::string::npos);
  EXPECT_NE(error_of("  - {name: prune, schedule: iterative, end_epoch: 1, update_frequency: 2}\n").find("no pruning step"),
            std::string::npos);
  EXPECT_NE(error_of("  - {name: prune, criterion: l3}\n").find("'l3'"), std::string::npos);
}

// An entry whose last step would remove nothing is refused before training (Modifier::claimed_layers,
// which the trainer calls on the model as loaded), with each group's reason: a run whose prune
// removed nothing was labelled "pruned L1 (sparsity 0.5)". One that removes something claims no
// layer (a quantize entry may share them).
TEST(PruneModifier, AnEntryThatWouldRemoveNothingIsRefusedBeforeTraining) {
  const Graph lenet = build_model("lenet5");
  const Recipe nothing = recipe(2, "  - {name: prune, sparsity: 0.5, round_to: 1000}\n");
  auto mod = modifier_info("prune").create(nothing.modifiers[0]);
  try {
    mod->claimed_layers(lenet);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("modifier 'prune': would remove nothing: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("keep every channel with these amounts (key 'round_to' 1000"),
              std::string::npos) << e.what();
  }
  const Recipe some = recipe(2, "  - {name: prune, sparsity: 0.5}\n");
  EXPECT_TRUE(modifier_info("prune").create(some.modifiers[0])->claimed_layers(lenet).empty());
  // Taylor scores need training; which groups can shrink does not.
  const Recipe taylor = recipe(2, "  - {name: prune, sparsity: 0.5, criterion: taylor, start_epoch: 1}\n");
  EXPECT_TRUE(modifier_info("prune").create(taylor.modifiers[0])->claimed_layers(lenet).empty());
}

// The optimizer state follows the pruned parameters: each kept channel keeps its momentum.
TEST(PruneModifier, MomentumIsSlicedWithTheParameters) {
  const Recipe r = recipe(2, "  - {name: prune, sparsity: 0.5, start_epoch: 1}\n");
  auto mod = modifier_info("prune").create(r.modifiers[0]);
  TrainContext tc;
  tc.model = GraphModule(build_model("lenet5"));
  tc.recipe = &r;
  std::vector<at::Tensor> params = trainable_parameters(tc.model);
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  for (auto& p : params) p.mutable_grad() = at::randn_like(p);
  sgd.step();  // every parameter has a momentum buffer now
  tc.optimizer = &sgd;
  const at::Tensor old_w = tc.model->graph().node("conv1").params.at("weight");
  const at::Tensor old_m =
      static_cast<const torch::optim::SGDParamState&>(*sgd.state().at(old_w.unsafeGetTensorImpl())).momentum_buffer();
  mod->on_start(tc);
  tc.epoch = 1.0;
  mod->on_step_begin(tc);
  ASSERT_TRUE(tc.parameters_changed);
  const at::Tensor new_w = tc.model->graph().node("conv1").params.at("weight");
  ASSERT_EQ(new_w.size(0), 3);
  auto it = sgd.state().find(new_w.unsafeGetTensorImpl());
  ASSERT_TRUE(it != sgd.state().end()) << "no state for the pruned conv1.weight";
  const at::Tensor new_m = static_cast<const torch::optim::SGDParamState&>(*it->second).momentum_buffer();
  ASSERT_EQ(new_m.sizes(), new_w.sizes());
  for (int64_t row = 0; row < new_w.size(0); ++row) {
    int64_t from = -1;
    for (int64_t k = 0; k < old_w.size(0); ++k)
      if (old_w[k].equal(new_w[row])) from = k;
    ASSERT_GE(from, 0);
    EXPECT_TRUE(new_m[row].equal(old_m[from])) << "row " << row << " kept channel " << from;
  }
  // The rebuilt optimizer carries it (what the trainer does after the hook).
  auto rebuilt = rebuild_optimizer(sgd, trainable_parameters(tc.model));
  EXPECT_EQ(rebuilt->state().count(new_w.unsafeGetTensorImpl()), 1u);
}

// bn_sparsity adds s·Σ|γ| to the loss: the γ gradient gains s·sign(γ).
TEST(BnSparsity, AddsTheL1PenaltyOfGamma) {
  const Recipe r = recipe(1, "  - {name: bn_sparsity, penalty: 0.5}\n");
  auto mod = modifier_info("bn_sparsity").create(r.modifiers[0]);
  TrainContext tc;
  tc.model = GraphModule(build_model("lenet5"));
  double sum = 0;
  for (const Node& n : tc.model->graph().nodes())
    if (n.op == "batch_norm") sum += n.params.at("weight").abs().sum().item<double>();
  ASSERT_GT(sum, 0);
  const at::Tensor loss = at::tensor(1.0);
  const at::Tensor out = mod->on_loss(tc, loss, {}, {}, {});
  EXPECT_NEAR(out.item<double>(), 1.0 + 0.5 * sum, 1e-5);

  // Once QAT has folded each BN into its layer, γ is the conv_bn_qat node's bn_weight (the
  // registry's norm_scale): the penalty stays the same.
  const size_t folded = fuse::prepare_qat_batchnorm(tc.model).fused.size();
  ASSERT_GT(folded, 0u);
  int64_t left = 0;
  for (const Node& n : tc.model->graph().nodes()) left += n.op == "batch_norm";
  EXPECT_EQ(left, 0);
  EXPECT_NEAR(mod->on_loss(tc, loss, {}, {}, {}).item<double>(), 1.0 + 0.5 * sum, 1e-5);
}

}  // namespace
}  // namespace whittle::runner
