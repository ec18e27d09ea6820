// The Trainer and its parts: rebuild_optimizer keeps the state of the parameters that remain
// (directly, and in a Trainer whose modifier replaces a parameter mid-epoch), modifiers' states,
// typed modifier options, the model loader, and the training-state file checks.

#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/output-archive.h>

#include <map>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "data/loader.h"
#include "distill/distill.h"
#include "export/checkpoint.h"
#include "fuse/qat_batchnorm.h"
#include "graph/graph_module.h"
#include "graph/serialize.h"
#include "graph/zoo.h"
#include "runner/amp.h"
#include "runner/model_loader.h"
#include "runner/modifier.h"
#include "runner/modifier_options.h"
#include "runner/optimizer.h"
#include "runner/quantize_modifier.h"
#include "runner/recipe.h"
#include "runner/train_state.h"
#include "runner/trainer.h"
#include "support.h"

namespace whittle::runner {
namespace {

using test::binary_dir;
using test::source_dir;

std::string out_dir(const std::string& name) {
  const std::string dir = join_path(binary_dir(), "testdata/trainer/" + name);
  remove_tree(dir);
  make_directories(dir);
  return dir;
}

// One SGD or Adam/AdamW step on each of `params` with gradient g = p + 1 (all finite, non-zero).
void one_step(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params) {
  opt.zero_grad();
  for (const auto& p : params) p.mutable_grad() = p.detach() + 1.0;
  opt.step();
}

const torch::optim::SGDParamState& sgd_state(const torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const torch::optim::SGDParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
}

template <typename State>
const State& param_state(const torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const State&>(*opt.state().at(p.unsafeGetTensorImpl()));
}

class RebuildOptimizer : public test::SeededTest {
 protected:
  at::Tensor a = at::randn({3, 2}).set_requires_grad(true);
  at::Tensor b = at::randn({4}).set_requires_grad(true);
  at::Tensor c = at::randn({2, 2}).set_requires_grad(true);
};

TEST_F(RebuildOptimizer, SgdKeepsMomentumOfParametersThatRemain) {
  torch::optim::SGD old({a, b}, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-4));
  one_step(old, {a, b});
  one_step(old, {a, b});
  set_learning_rate(old, 0.025);  // as the schedule sets it
  const at::Tensor momentum_a = sgd_state(old, a).momentum_buffer().clone();

  // b is gone, c is new.
  auto fresh = rebuild_optimizer(old, {a, c});
  ASSERT_NE(dynamic_cast<torch::optim::SGD*>(fresh.get()), nullptr);
  ASSERT_EQ(fresh->param_groups().size(), 1u);
  const auto& params = fresh->param_groups()[0].params();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_TRUE(params[0].is_same(a));
  EXPECT_TRUE(params[1].is_same(c));
  EXPECT_TRUE(sgd_state(*fresh, a).momentum_buffer().equal(momentum_a));
  EXPECT_EQ(fresh->state().count(b.unsafeGetTensorImpl()), 0u);
  EXPECT_EQ(fresh->state().count(c.unsafeGetTensorImpl()), 0u);
  const auto& o = static_cast<const torch::optim::SGDOptions&>(fresh->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.lr(), 0.025);
  EXPECT_DOUBLE_EQ(o.momentum(), 0.9);
  EXPECT_TRUE(o.nesterov());
  EXPECT_DOUBLE_EQ(o.weight_decay(), 5e-4);

  // The next step continues a's momentum exactly as the old optimizer would have.
  torch::optim::SGD reference({a.detach().clone().set_requires_grad(true)},
                              torch::optim::SGDOptions(0.025).momentum(0.9).nesterov(true).weight_decay(5e-4));
  const at::Tensor ref_a = reference.param_groups()[0].params()[0];
  auto ref_state = std::make_unique<torch::optim::SGDParamState>();
  ref_state->momentum_buffer(momentum_a.clone());
  reference.state()[ref_a.unsafeGetTensorImpl()] = std::move(ref_state);
  one_step(*fresh, {a, c});
  one_step(reference, {ref_a});
  EXPECT_TRUE(a.equal(ref_a));
  EXPECT_EQ(fresh->state().count(c.unsafeGetTensorImpl()), 1u);
}

// The state before the first step: none to keep, and the rebuild still works.
TEST_F(RebuildOptimizer, SgdWithoutStateYet) {
  torch::optim::SGD old({a}, torch::optim::SGDOptions(0.1).momentum(0.9));
  auto fresh = rebuild_optimizer(old, {a, b});
  EXPECT_TRUE(fresh->state().empty());
  EXPECT_EQ(fresh->param_groups()[0].params().size(), 2u);
}

// FusedSGD (ATen's fused kernel) against torch::optim::SGD over several steps with momentum,
// Nesterov and weight decay, two groups (one without momentum), a parameter without a gradient
// and a non-contiguous one (the unfused fallback): the same parameters and momentum buffers up to
// float rounding; a rebuild keeps the fused kind.
TEST_F(RebuildOptimizer, FusedSgdFollowsSgd) {
  at::Tensor d = at::randn({3, 5}).t().set_requires_grad(true);  // not contiguous
  at::Tensor idle = at::randn({2}).set_requires_grad(true);      // never gets a gradient
  auto copies = [](const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> out;
    for (const auto& t : ts) out.push_back(t.detach().clone().set_requires_grad(true));
    return out;
  };
  const std::vector<at::Tensor> ours_g1 = copies({a, b, idle}), ours_g2 = copies({c}), ours_g3 = copies({d});
  const std::vector<at::Tensor> ref_g1 = copies({a, b, idle}), ref_g2 = copies({c}), ref_g3 = copies({d});
  auto groups = [](const std::vector<at::Tensor>& g1, const std::vector<at::Tensor>& g2, const std::vector<at::Tensor>& g3) {
    return std::vector<torch::optim::OptimizerParamGroup>{
        torch::optim::OptimizerParamGroup(g1, std::make_unique<torch::optim::SGDOptions>(
                                                  torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-4))),
        torch::optim::OptimizerParamGroup(g2, std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.05))),
        torch::optim::OptimizerParamGroup(g3, std::make_unique<torch::optim::SGDOptions>(
                                                  torch::optim::SGDOptions(0.1).momentum(0.5).weight_decay(1e-3)))};
  };
  FusedSGD fused(groups(ours_g1, ours_g2, ours_g3), torch::optim::SGDOptions(0.1));
  torch::optim::SGD reference(groups(ref_g1, ref_g2, ref_g3), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 4; ++step) {
    for (const auto* set : {&ours_g1, &ours_g2, &ours_g3, &ref_g1, &ref_g2, &ref_g3})
      for (const auto& p : *set) p.mutable_grad() = p.detach() * 0.5 + 1.0 + step;
    // The idle parameter (last of group 1) gets none.
    ours_g1[2].mutable_grad() = at::Tensor();
    ref_g1[2].mutable_grad() = at::Tensor();
    fused.step();
    reference.step();
  }
  const std::vector<at::Tensor> ours = {ours_g1[0], ours_g1[1], ours_g1[2], ours_g2[0], ours_g3[0]};
  const std::vector<at::Tensor> refs = {ref_g1[0], ref_g1[1], ref_g1[2], ref_g2[0], ref_g3[0]};
  const std::vector<at::Tensor> starts = {a, b, idle, c, d};
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_TRUE(at::allclose(ours[i], refs[i], 1e-6, 1e-7)) << i << ": " << (ours[i] - refs[i]).abs().max().item<double>();
    EXPECT_EQ(ours[i].equal(starts[i]), i == 2) << i;  // every parameter moved but the idle one
  }
  EXPECT_TRUE(at::allclose(sgd_state(fused, ours_g1[0]).momentum_buffer(), sgd_state(reference, ref_g1[0]).momentum_buffer(),
                           1e-6, 1e-7));
  EXPECT_EQ(fused.state().count(ours_g2[0].unsafeGetTensorImpl()), 0u);  // momentum 0: no buffer, as SGD
  EXPECT_EQ(reference.state().count(ref_g2[0].unsafeGetTensorImpl()), 0u);
  auto fresh = rebuild_optimizer(fused, {ours_g1[0], ours_g2[0]});
  EXPECT_NE(dynamic_cast<FusedSGD*>(fresh.get()), nullptr);
}

TEST_F(RebuildOptimizer, AdamKeepsStepAndMoments) {
  torch::optim::Adam old({a, b, c}, torch::optim::AdamOptions(1e-3).betas({0.8, 0.99}).eps(1e-6).weight_decay(1e-4));
  for (int i = 0; i < 3; ++i) one_step(old, {a, b, c});
  const auto& sa = param_state<torch::optim::AdamParamState>(old, a);
  const auto& sc = param_state<torch::optim::AdamParamState>(old, c);
  const at::Tensor avg_a = sa.exp_avg().clone(), sq_a = sa.exp_avg_sq().clone();
  const at::Tensor avg_c = sc.exp_avg().clone(), sq_c = sc.exp_avg_sq().clone();

  auto fresh = rebuild_optimizer(old, {c, a});  // b removed; order follows the new list
  ASSERT_NE(dynamic_cast<torch::optim::Adam*>(fresh.get()), nullptr);
  ASSERT_EQ(fresh->state().size(), 2u);
  const auto& na = param_state<torch::optim::AdamParamState>(*fresh, a);
  const auto& nc = param_state<torch::optim::AdamParamState>(*fresh, c);
  EXPECT_EQ(na.step(), 3);
  EXPECT_EQ(nc.step(), 3);
  EXPECT_TRUE(na.exp_avg().equal(avg_a));
  EXPECT_TRUE(na.exp_avg_sq().equal(sq_a));
  EXPECT_TRUE(nc.exp_avg().equal(avg_c));
  EXPECT_TRUE(nc.exp_avg_sq().equal(sq_c));
  const auto& o = static_cast<const torch::optim::AdamOptions&>(fresh->param_groups()[0].options());
  EXPECT_EQ(std::get<0>(o.betas()), 0.8);
  EXPECT_EQ(std::get<1>(o.betas()), 0.99);
  EXPECT_DOUBLE_EQ(o.eps(), 1e-6);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 1e-4);
}

TEST_F(RebuildOptimizer, AdamWAndParameterGroups) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<torch::optim::AdamWOptions>(1e-3));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<torch::optim::AdamWOptions>(5e-4));
  torch::optim::AdamW old(groups, torch::optim::AdamWOptions(1e-3).weight_decay(0.05));
  one_step(old, {a, b});
  const at::Tensor avg_b = param_state<torch::optim::AdamWParamState>(old, b).exp_avg().clone();
  auto fresh = rebuild_optimizer(old, {b, c, a});
  ASSERT_NE(dynamic_cast<torch::optim::AdamW*>(fresh.get()), nullptr);
  ASSERT_EQ(fresh->param_groups().size(), 2u);
  // a stays in group 0 and the new c joins it; b stays in group 1 with its learning rate.
  EXPECT_EQ(fresh->param_groups()[0].params().size(), 2u);
  EXPECT_TRUE(fresh->param_groups()[0].params()[0].is_same(c));
  EXPECT_TRUE(fresh->param_groups()[0].params()[1].is_same(a));
  ASSERT_EQ(fresh->param_groups()[1].params().size(), 1u);
  EXPECT_TRUE(fresh->param_groups()[1].params()[0].is_same(b));
  EXPECT_DOUBLE_EQ(fresh->param_groups()[1].options().get_lr(), 5e-4);
  EXPECT_TRUE(param_state<torch::optim::AdamWParamState>(*fresh, b).exp_avg().equal(avg_b));
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::AdamWOptions&>(fresh->defaults()).weight_decay(), 0.05);
}

// norm_weight_decay and bias_weight_decay: which tensors the registry names, the groups
// make_optimizer makes, and one hand-worked SGD step in each group.
TEST(WeightDecayGroups, NormAndBiasParametersGetTheirOwnDecay) {
  GraphModule model(build_model("resnet20"));
  OptimizerSpec spec;
  spec.lr = 0.1;
  spec.momentum = 0;
  spec.weight_decay = 5e-4;
  EXPECT_TRUE(weight_decay_overrides({model}, spec).empty());
  spec.norm_weight_decay = 5e-4;  // equal to weight_decay: no group of its own
  EXPECT_TRUE(weight_decay_overrides({model}, spec).empty());
  EXPECT_EQ(make_optimizer(spec, trainable_parameters(model), weight_decay_overrides({model}, spec))->param_groups().size(),
            1u);

  spec.norm_weight_decay = 0;
  const WeightDecayOverrides norm_only = weight_decay_overrides({model}, spec);
  // ResNet-20 with projection shortcuts: 19 batch norms (1 stem, 18 in the blocks) and 2 shortcut
  // BNs, each with γ and β; the classifier's bias keeps weight_decay.
  size_t batch_norms = 0;
  for (const Node& n : model->graph().nodes()) batch_norms += n.op == "batch_norm";
  EXPECT_EQ(batch_norms, 21u);
  EXPECT_EQ(norm_only.size(), 2 * batch_norms);
  for (const Node& n : model->graph().nodes())
    for (const auto& [name, t] : n.params)
      EXPECT_EQ(norm_only.count(t.unsafeGetTensorImpl()), n.op == "batch_norm" ? 1u : 0u) << n.name << "." << name;

  spec.bias_weight_decay = 1e-3;
  const WeightDecayOverrides both = weight_decay_overrides({model}, spec);
  const at::Tensor& fc_bias = model->graph().node("linear").params.at("bias");
  const at::Tensor& fc_weight = model->graph().node("linear").params.at("weight");
  const at::Tensor& gamma = model->graph().node("bn1").params.at("weight");
  ASSERT_EQ(both.count(fc_bias.unsafeGetTensorImpl()), 1u);
  EXPECT_DOUBLE_EQ(both.at(fc_bias.unsafeGetTensorImpl()), 1e-3);
  EXPECT_DOUBLE_EQ(both.at(gamma.unsafeGetTensorImpl()), 0.0);
  EXPECT_EQ(both.count(fc_weight.unsafeGetTensorImpl()), 0u);

  // Groups: weight_decay first, then the others in order of first appearance (bn1 comes before
  // the classifier).
  const std::vector<at::Tensor> params = trainable_parameters(model);
  auto opt = make_optimizer(spec, params, both);
  ASSERT_EQ(opt->param_groups().size(), 3u);
  const auto decay = [&](size_t g) {
    return static_cast<const torch::optim::SGDOptions&>(opt->param_groups()[g].options()).weight_decay();
  };
  EXPECT_DOUBLE_EQ(decay(0), 5e-4);
  EXPECT_DOUBLE_EQ(decay(1), 0.0);
  EXPECT_DOUBLE_EQ(decay(2), 1e-3);
  EXPECT_EQ(opt->param_groups()[1].params().size(), 2 * batch_norms);
  ASSERT_EQ(opt->param_groups()[2].params().size(), 1u);
  EXPECT_TRUE(opt->param_groups()[2].params()[0].is_same(fc_bias));
  EXPECT_EQ(opt->param_groups()[0].params().size() + 2 * batch_norms + 1, params.size());

  // One step at lr 1 with gradient p + 1 from p = c: c − ((c + 1) + λ·c) = −1 − λ·c, λ the
  // tensor's decay.
  const at::Tensor& beta = model->graph().node("bn1").params.at("bias");
  {
    at::NoGradGuard no_grad;
    fc_weight.fill_(1);
    gamma.fill_(2);
    beta.fill_(3);
    fc_bias.fill_(4);
  }
  spec.lr = 1;
  opt = make_optimizer(spec, params, both);
  one_step(*opt, params);
  EXPECT_TRUE(fc_weight.allclose(at::full_like(fc_weight, -1.0005), 0, 1e-6));  // 5e-4
  EXPECT_TRUE(gamma.allclose(at::full_like(gamma, -1.0), 0, 1e-6));              // 0
  EXPECT_TRUE(beta.allclose(at::full_like(beta, -1.0), 0, 1e-6));                // 0
  EXPECT_TRUE(fc_bias.allclose(at::full_like(fc_bias, -1.004), 0, 1e-6));        // 1e-3

  // The fused SGD and AdamW group the same way.
  spec.fused = true;
  auto fused = make_optimizer(spec, params, both);
  EXPECT_NE(dynamic_cast<FusedSGD*>(fused.get()), nullptr);
  ASSERT_EQ(fused->param_groups().size(), 3u);
  EXPECT_EQ(weight_decay_of(fused->param_groups()[1].options()), 0.0);
  spec.fused = false;
  spec.name = "adamw";
  auto adamw = make_optimizer(spec, params, both);
  ASSERT_EQ(adamw->param_groups().size(), 3u);
  EXPECT_EQ(weight_decay_of(adamw->param_groups()[0].options()), 5e-4);
  EXPECT_EQ(weight_decay_of(adamw->param_groups()[2].options()), 1e-3);
}

// In QAT-folded layers (conv_bn_qat) the BN's γ and β keep norm_weight_decay, as do a
// distillation hint adapter's (the trainer passes the modifiers' modules too).
TEST(WeightDecayGroups, QatFoldedBatchNormAndModifierModules) {
  GraphModule model(build_model("resnet20"));
  fuse::prepare_qat_batchnorm(model);
  OptimizerSpec spec;
  spec.weight_decay = 5e-4;
  spec.norm_weight_decay = 0;
  const WeightDecayOverrides wd = weight_decay_overrides({model}, spec);
  size_t folded = 0;
  for (const Node& n : model->graph().nodes())
    if (n.op == "conv_bn_qat") {
      ++folded;
      EXPECT_EQ(wd.count(n.params.at("bn_weight").unsafeGetTensorImpl()), 1u) << n.name;
      EXPECT_EQ(wd.count(n.params.at("bn_bias").unsafeGetTensorImpl()), 1u) << n.name;
      EXPECT_EQ(wd.count(n.params.at("weight").unsafeGetTensorImpl()), 0u) << n.name;
    }
  EXPECT_EQ(folded, 21u);
  EXPECT_EQ(wd.size(), 2 * folded);
  GraphModule adapter = distill::hint_adapter({1, 16, 8, 8}, 32, 0);
  EXPECT_EQ(weight_decay_overrides({model, adapter}, spec).size(), 2 * folded + 2);
}

// The registry names the normalization parameters, also inside a QAT conv_bn_qat node.
TEST(WeightDecayGroups, RegistryNamesNormParameters) {
  Node bn;
  bn.op = "batch_norm";
  EXPECT_TRUE(is_norm_param(bn, "weight"));
  EXPECT_TRUE(is_norm_param(bn, "bias"));
  Node qat;
  qat.op = "conv_bn_qat";
  EXPECT_TRUE(is_norm_param(qat, "bn_weight"));
  EXPECT_TRUE(is_norm_param(qat, "bn_bias"));
  EXPECT_FALSE(is_norm_param(qat, "weight"));
  EXPECT_FALSE(is_norm_param(qat, "bias"));
  Node conv;
  conv.op = "conv2d";
  EXPECT_FALSE(is_norm_param(conv, "bias"));
}

// The recipe keys: unset means weight_decay; a value out of range is a usage error naming the key.
TEST(WeightDecayGroups, RecipeKeys) {
  const std::string mnist = join_path(source_dir(), "data/mnist10k");
  const auto recipe = [&](const std::string& optimizer) {
    return parse_recipe("model: {name: lenet5}\ndata: {train: " + mnist + ", test: " + mnist +
                            ", test_split: t10k}\ntraining:\n  optimizer: " + optimizer + "\n",
                        "<wd>", source_dir());
  };
  const Recipe plain = recipe("{weight_decay: 5e-4}");
  EXPECT_FALSE(plain.training.optimizer.norm_weight_decay.has_value());
  EXPECT_FALSE(plain.training.optimizer.bias_weight_decay.has_value());
  const Recipe set = recipe("{weight_decay: 5e-4, norm_weight_decay: 0, bias_weight_decay: 1e-4}");
  EXPECT_EQ(set.training.optimizer.norm_weight_decay, 0.0);
  EXPECT_EQ(set.training.optimizer.bias_weight_decay, 1e-4);
  try {
    recipe("{norm_weight_decay: -1}");
    ADD_FAILURE() << "a negative norm_weight_decay was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("norm_weight_decay"), std::string::npos) << e.what();
  }
}

// model.weight_init reaches the zoo model the Trainer builds: with kaiming_normal, the first conv
// of LeNet-5 (fan_in 25) has the weights build_model draws with that option and training.seed,
// not the default ones. An unknown value is a usage error naming the key and the choices.
TEST(ModelWeightInit, RecipeKeyReachesTheModel) {
  const std::string mnist = join_path(source_dir(), "data/mnist10k");
  const auto recipe = [&](const std::string& model) {
    return parse_recipe("model: " + model + "\ndata: {train: " + mnist + ", test: " + mnist +
                            ", test_split: t10k, batch_size: 32, train_limit: 64, test_limit: 32, num_workers: 0}\n"
                            "training: {epochs: 1, seed: 5, threads: 1}\n",
                        "<weight_init>", source_dir());
  };
  EXPECT_EQ(recipe("{name: lenet5}").model.weight_init, "torch");
  const Recipe he = recipe("{name: lenet5, weight_init: kaiming_normal}");
  EXPECT_EQ(he.model.weight_init, "kaiming_normal");
  RunOptions o;
  o.out_dir = out_dir("weight_init");
  std::ostringstream log;
  o.log = &log;
  Trainer tr(he, o);
  ZooOptions z;
  z.seed = 5;
  z.weight_init = WeightInit::kKaimingNormal;
  const at::Tensor expected = build_model("lenet5", z).node("conv1").params.at("weight");
  EXPECT_TRUE(tr.model()->graph().node("conv1").params.at("weight").equal(expected));
  z.weight_init = WeightInit::kTorch;
  EXPECT_FALSE(tr.model()->graph().node("conv1").params.at("weight").equal(
      build_model("lenet5", z).node("conv1").params.at("weight")));
  const std::string what = test::usage_error_message([&] { recipe("{name: lenet5, weight_init: he}"); });
  EXPECT_NE(what.find("weight_init"), std::string::npos) << what;
  EXPECT_NE(what.find("kaiming_normal"), std::string::npos) << what;
}

// A parameter a modifier adds joins the group of its decay, or a new group with that decay.
TEST_F(RebuildOptimizer, NewParametersJoinTheGroupOfTheirDecay) {
  at::Tensor d = at::randn({5}).set_requires_grad(true);
  at::Tensor e = at::randn({6}).set_requires_grad(true);
  OptimizerSpec spec;
  spec.weight_decay = 5e-4;
  spec.momentum = 0.9;
  auto old = make_optimizer(spec, {a, b}, {{b.unsafeGetTensorImpl(), 0.0}});
  ASSERT_EQ(old->param_groups().size(), 2u);
  one_step(*old, {a, b});
  set_learning_rate(*old, 0.05);
  // c has decay 0 (joins b's group), d none (joins a's), e 1e-3 (a new group).
  auto fresh = rebuild_optimizer(*old, {a, b, c, d, e},
                                 {{b.unsafeGetTensorImpl(), 0.0}, {c.unsafeGetTensorImpl(), 0.0}, {e.unsafeGetTensorImpl(), 1e-3}});
  ASSERT_EQ(fresh->param_groups().size(), 3u);
  const auto& g = fresh->param_groups();
  ASSERT_EQ(g[0].params().size(), 2u);
  EXPECT_TRUE(g[0].params()[0].is_same(a));
  EXPECT_TRUE(g[0].params()[1].is_same(d));
  ASSERT_EQ(g[1].params().size(), 2u);
  EXPECT_TRUE(g[1].params()[0].is_same(b));
  EXPECT_TRUE(g[1].params()[1].is_same(c));
  ASSERT_EQ(g[2].params().size(), 1u);
  EXPECT_TRUE(g[2].params()[0].is_same(e));
  for (size_t i = 0; i < 3; ++i) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(g[i].options());
    const double want[] = {5e-4, 0.0, 1e-3};
    EXPECT_DOUBLE_EQ(o.weight_decay(), want[i]);
    EXPECT_DOUBLE_EQ(o.lr(), 0.05);  // the schedule's current rate, in the new group too
    EXPECT_DOUBLE_EQ(o.momentum(), 0.9);
  }
  EXPECT_EQ(fresh->state().count(b.unsafeGetTensorImpl()), 1u);
  EXPECT_EQ(fresh->state().count(c.unsafeGetTensorImpl()), 0u);

  // Without the base group (every old parameter had decay 0), a new parameter without an override
  // takes the weight_decay given, in a new group, not group 0's decay.
  auto only_zero = make_optimizer(spec, {a}, {{a.unsafeGetTensorImpl(), 0.0}});
  ASSERT_EQ(only_zero->param_groups().size(), 1u);
  auto grown = rebuild_optimizer(*only_zero, {a, d}, {{a.unsafeGetTensorImpl(), 0.0}}, 5e-4);
  ASSERT_EQ(grown->param_groups().size(), 2u);
  EXPECT_EQ(weight_decay_of(grown->param_groups()[0].options()), 0.0);
  EXPECT_EQ(weight_decay_of(grown->param_groups()[1].options()), 5e-4);
  EXPECT_TRUE(grown->param_groups()[1].params()[0].is_same(d));
}

// ---------------------------------------------------------------- a Trainer whose modifier
// replaces a parameter mid-epoch

struct ReplaceBiasOptions {
  int64_t at_step = 2;  ///< optimizer step after which fc3.bias is replaced
  std::string node = "fc3";
};

const OptionsSchema<ReplaceBiasOptions>& replace_bias_schema() {
  static const auto s = OptionsSchema<ReplaceBiasOptions>()
                            .add("at_step", &ReplaceBiasOptions::at_step, "step after which the bias is replaced")
                            .add("node", &ReplaceBiasOptions::node, "node whose bias is replaced");
  return s;
}

// In on_step_end of step `at_step`: records every parameter's optimizer state (by name), then
// gives `node` a new bias tensor (zeros) and sets parameters_changed.
class ReplaceBias : public Modifier {
 public:
  ReplaceBias(const ModifierSpec& spec, ReplaceBiasOptions o) : Modifier(spec), o_(std::move(o)) {}
  void on_step_end(TrainContext& tc) override {
    if (tc.step != o_.at_step) return;
    optimizer_before = tc.optimizer;
    for (const auto& p : tc.model->named_parameters()) {
      auto it = tc.optimizer->state().find(p.value().unsafeGetTensorImpl());
      if (it == tc.optimizer->state().end()) continue;
      if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        before[p.key()] = {s->momentum_buffer().clone()};
      } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        before[p.key()] = {s->exp_avg().clone(), s->exp_avg_sq().clone()};
        steps[p.key()] = s->step();
      }
    }
    Node& n = tc.model->graph().node(o_.node);
    old_bias = n.params.at("bias");
    n.params.set("bias", at::zeros_like(old_bias).set_requires_grad(true));
    tc.model->sync();
    tc.parameters_changed = true;
  }

  std::map<std::string, std::vector<at::Tensor>> before;
  std::map<std::string, int64_t> steps;
  const torch::optim::Optimizer* optimizer_before = nullptr;
  at::Tensor old_bias;

 private:
  ReplaceBiasOptions o_;
};

class TrainerTest : public test::SeededTest {
 protected:
  void SetUp() override {
    test::SeededTest::SetUp();
    ModifierInfo info;
    info.name = "test_replace_bias";
    info.description = "replaces a layer's bias after a given step (tests)";
    info.settings = replace_bias_schema().keys();
    info.create = [](const ModifierSpec& spec) {
      return std::make_unique<ReplaceBias>(spec, replace_bias_schema().parse(spec.settings, spec.location));
    };
    register_modifier(info);
  }

  Recipe recipe(const std::string& optimizer) const {
    const std::string mnist = join_path(source_dir(), "data/mnist10k");
    return parse_recipe(
        "model: {name: lenet5}\n"
        "data: {train: " +
            mnist + ", test: " + mnist +
            ", test_split: t10k, batch_size: 32,\n"
            "       train_limit: 256, test_limit: 100, num_workers: 0}\n"
            "training:\n"
            "  epochs: 1\n"
            "  optimizer: {name: " +
            optimizer +
            ", lr: 0.01, momentum: 0.9}\n"
            "  threads: 1\n"
            "modifiers:\n"
            "  - {name: test_replace_bias, at_step: 2}\n",
        "<trainer_test>", source_dir());
  }
};

// Drives the Trainer batch by batch; after step 2 the modifier replaced fc3.bias, and the
// optimizer that the Trainer rebuilt holds the state of every other parameter unchanged.
void expect_state_carried_over(Trainer& tr, bool adam) {
  auto* mod = dynamic_cast<ReplaceBias*>(tr.modifiers().at(0).get());
  ASSERT_NE(mod, nullptr);
  tr.model()->train();
  tr.step(tr.train_loader().batch(0, 0));
  EXPECT_TRUE(mod->before.empty());
  tr.step(tr.train_loader().batch(0, 1));
  EXPECT_EQ(tr.state().step, 2);
  EXPECT_EQ(tr.state().batch, 2);
  const size_t trainable = trainable_parameters(tr.model()).size();
  ASSERT_EQ(mod->before.size(), trainable);  // every trainable tensor had state after 2 steps
  EXPECT_FALSE(tr.context().parameters_changed);
  EXPECT_EQ(tr.context().optimizer, &tr.optimizer());

  // The new optimizer runs over the current trainable parameters, in order.
  const std::vector<at::Tensor> now = trainable_parameters(tr.model());
  const auto& params = tr.optimizer().param_groups().at(0).params();
  ASSERT_EQ(params.size(), now.size());
  for (size_t i = 0; i < now.size(); ++i) EXPECT_TRUE(params[i].is_same(now[i])) << i;
  EXPECT_DOUBLE_EQ(tr.optimizer().param_groups()[0].options().get_lr(), 0.01);

  int carried = 0;
  for (const auto& p : tr.model()->named_parameters()) {
    auto it = tr.optimizer().state().find(p.value().unsafeGetTensorImpl());
    if (p.key() == "fc3.bias") {
      EXPECT_FALSE(p.value().is_same(mod->old_bias));
      EXPECT_TRUE(it == tr.optimizer().state().end()) << "the replaced bias starts without state";
      continue;
    }
    ASSERT_TRUE(it != tr.optimizer().state().end()) << p.key();
    const std::vector<at::Tensor>& before = mod->before.at(p.key());
    if (adam) {
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
      EXPECT_TRUE(s.exp_avg().equal(before[0])) << p.key();
      EXPECT_TRUE(s.exp_avg_sq().equal(before[1])) << p.key();
      EXPECT_EQ(s.step(), mod->steps.at(p.key())) << p.key();
    } else {
      const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
      EXPECT_TRUE(s.momentum_buffer().equal(before[0])) << p.key();
    }
    ++carried;
  }
  EXPECT_EQ(carried, static_cast<int>(trainable) - 1);
  // Training goes on; the new bias gets its state at the next step.
  tr.step(tr.train_loader().batch(0, 2));
  EXPECT_EQ(tr.optimizer().state().count(tr.model()->graph().node("fc3").params.at("bias").unsafeGetTensorImpl()), 1u);
}

TEST_F(TrainerTest, SgdMomentumOfRemainingParametersSurvivesAParameterChange) {
  RunOptions o;
  o.out_dir = out_dir("replace_bias_sgd");
  std::ostringstream log;
  o.log = &log;
  Trainer tr(recipe("sgd"), o);
  expect_state_carried_over(tr, /*adam=*/false);
}

TEST_F(TrainerTest, AdamMomentsOfRemainingParametersSurviveAParameterChange) {
  RunOptions o;
  o.out_dir = out_dir("replace_bias_adam");
  std::ostringstream log;
  o.log = &log;
  Trainer tr(recipe("adam"), o);
  expect_state_carried_over(tr, /*adam=*/true);
}

// A whole run with the modifier: completes, and --resume of the finished run refuses another recipe.
TEST_F(TrainerTest, RunAndResumeChecks) {
  RunOptions o;
  o.out_dir = out_dir("replace_bias_run");
  std::ostringstream log;
  o.log = &log;
  const Recipe r = recipe("sgd");
  RunResult res = run_recipe(r, o);
  EXPECT_EQ(res.epochs_done, 1) << log.str();
  EXPECT_FALSE(res.interrupted);
  EXPECT_TRUE(is_regular_file(join_path(o.out_dir, "train_state.pt")));
  // Resuming a finished run does nothing: the run's report gives its figures, no file changes.
  o.resume = true;
  const std::string ckpt = read_file(join_path(o.out_dir, "model.h5"));
  const std::string report = read_file(join_path(o.out_dir, "report.json"));
  RunResult again = run_recipe(r, o);
  EXPECT_TRUE(again.finished_before);
  EXPECT_EQ(again.epochs_done, 1) << log.str();
  EXPECT_EQ(again.test.top1, res.test.top1);
  EXPECT_EQ(again.test.samples, res.test.samples);
  EXPECT_EQ(read_file(join_path(o.out_dir, "model.h5")), ckpt);
  EXPECT_EQ(read_file(join_path(o.out_dir, "report.json")), report);
  // Without its checkpoint the run is not complete: the resume finishes it again.
  remove_file(join_path(o.out_dir, "model.h5"));
  RunResult refinished = run_recipe(r, o);
  EXPECT_FALSE(refinished.finished_before);
  EXPECT_TRUE(is_regular_file(join_path(o.out_dir, "model.h5")));
  // The saved model evaluated again: exact, on any thread count or instruction set, because both
  // evaluations run in this process with the same weights, data order and threads.
  EXPECT_EQ(refinished.test.top1, res.test.top1);
  // The same recipe with a comment added resumes: recipes are compared as YAML.
  Recipe commented = parse_recipe("# a note\n" + r.text + "# changed\n", "<commented>", source_dir());
  EXPECT_NO_THROW(run_recipe(commented, o)) << log.str();
  // Another value is refused.
  std::string text = r.text;
  text.replace(text.find("lr: 0.01"), 8, "lr: 0.02");
  Recipe other = parse_recipe(text, "<other>", source_dir());
  try {
    run_recipe(other, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the recipe differs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(join_path(o.out_dir, "train_state.pt")), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- training-state file

TEST(TrainState, RoundTripAndChecks) {
  const std::string dir = out_dir("state");
  const std::string path = join_path(dir, "train_state.pt");
  ZooOptions zo;
  zo.seed = 1;
  GraphModule model(build_model("lenet5", zo));
  model->graph().node("fc3").params.find("bias")->set_requires_grad(false);
  torch::optim::SGD opt(trainable_parameters(model), torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainerState st;
  st.epoch = 2;
  st.batch = 7;
  st.step = 71;
  st.loss_sum = 12.5;
  st.correct = 200;
  st.seen = 224;
  st.train_seconds = 33.25;
  LossScaler scaler(true);
  scaler.restore(1024.0, 17);
  save_train_state(path, "recipe text\n", st, model, {}, opt, scaler);

  SavedTrainState saved = SavedTrainState::read(path, "recipe text\n");
  EXPECT_EQ(saved.state().epoch, 2);
  EXPECT_EQ(saved.state().batch, 7);
  EXPECT_EQ(saved.state().step, 71);
  EXPECT_EQ(saved.state().loss_sum, 12.5);
  EXPECT_EQ(saved.state().correct, 200);
  EXPECT_EQ(saved.state().train_seconds, 33.25);  // the epoch's seconds so far carry over a resume
  EXPECT_EQ(saved.state().seen, 224);
  EXPECT_EQ(saved.frozen_parameters(), std::vector<std::string>{"fc3.bias"});
  Graph g = saved.take_graph();
  EXPECT_EQ(graph_to_json(g), graph_to_json(model->graph()));
  for (const auto& n : g.nodes())
    for (const auto& kv : n.params) {
      EXPECT_TRUE(kv.second.equal(model->graph().node(n.name).params.at(kv.first))) << n.name << "." << kv.first;
      EXPECT_EQ(kv.second.requires_grad(), !(n.name == "fc3" && kv.first == "bias")) << n.name << "." << kv.first;
    }
  EXPECT_THROW(saved.take_graph(), Error);
  LossScaler back(true);
  saved.restore_loss_scaler(back);
  EXPECT_EQ(back.scale(), 1024.0);
  EXPECT_EQ(back.clean_steps(), 17);

  // The same recipe with other comments and spacing: resumes (a comment edit changes nothing).
  EXPECT_NO_THROW(SavedTrainState::read(path, "# epochs were changed in a comment only\nrecipe text  # trailing\n"));
  // Another recipe text: refused, naming the file.
  try {
    SavedTrainState::read(path, "another recipe\n");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("the recipe differs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  // A format 1 state (before the graph and the modifiers' states were saved): refused.
  const std::string old_path = join_path(dir, "old_state.pt");
  torch::serialize::OutputArchive a;
  a.write("format", at::tensor(int64_t{1}));
  a.write("epoch", at::tensor(int64_t{1}));
  a.save_to(old_path);
  try {
    SavedTrainState::read(old_path, "recipe text\n");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("format 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("older whittle"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(old_path), std::string::npos) << e.what();
  }
  EXPECT_THROW(SavedTrainState::read(join_path(dir, "missing.pt"), ""), Error);
}

// ---------------------------------------------------------------- modifiers' states

Recipe qat_recipe(double quantize_start) {
  const std::string mnist = join_path(source_dir(), "data/mnist10k");
  std::ostringstream text;
  text << "model: {name: lenet5}\n"
       << "data: {train: " << mnist << ", test: " << mnist << "}\n"
       << "training: {epochs: 3}\n"
       << "modifiers:\n"
       << "  - {name: quantize, method: dorefa, weight_bits: 4, activation_bits: 4, start_epoch: " << quantize_start
       << "}\n"
       << "  - {name: fuse_batchnorm, mode: qat, start_epoch: " << quantize_start << ", freeze_bn_epoch: 2}\n";
  return parse_recipe(text.str(), "<qat>", source_dir());
}

int64_t count_op(const Graph& g, const std::string& op) {
  int64_t n = 0;
  for (const auto& node : g.nodes()) n += node.op == op ? 1 : 0;
  return n;
}

TEST(ModifierState, RestoredModifiersDoNotApplyAgain) {
  const Recipe r = qat_recipe(0);
  std::vector<std::unique_ptr<Modifier>> mods;
  for (const auto& spec : r.modifiers) mods.push_back(modifier_info(spec.name).create(spec));
  TrainContext tc;
  tc.model = GraphModule(build_model("lenet5"));
  tc.recipe = &r;
  EXPECT_EQ(mods[0]->state(), R"({"applied":false})");
  EXPECT_EQ(mods[1]->state(), R"({"frozen":false,"prepared":false})");
  for (auto& m : mods) m->on_start(tc);
  tc.epoch = 2;
  mods[1]->on_epoch_begin(tc);
  EXPECT_EQ(mods[0]->state(), R"({"applied":true})");
  EXPECT_EQ(mods[1]->state(), R"({"frozen":true,"prepared":true})");
  const std::string graph = graph_to_json(tc.model->graph());
  EXPECT_EQ(count_op(tc.model->graph(), "act_quant"), 3);
  EXPECT_EQ(count_op(tc.model->graph(), "batch_norm"), 0);  // all four QAT-folded

  // Fresh modifiers restored from those states change nothing in on_start or on_epoch_begin.
  std::vector<std::unique_ptr<Modifier>> again;
  for (const auto& spec : r.modifiers) again.push_back(modifier_info(spec.name).create(spec));
  for (size_t i = 0; i < again.size(); ++i) again[i]->load_state(mods[i]->state());
  for (auto& m : again) m->on_start(tc);
  again[1]->on_epoch_begin(tc);
  EXPECT_EQ(graph_to_json(tc.model->graph()), graph);
  EXPECT_THROW(again[0]->load_state("not json"), Error);
}

// ---------------------------------------------------------------- typed options

struct ExampleOptions {
  double sparsity = 0.5;
  int64_t steps = 3;
  bool global = false;
  std::string criterion = "l1";
  std::vector<double> levels;
  std::optional<int64_t> bits;
};

TEST(OptionsSchema, DefaultsComeFromTheStructAndParseTypesValues) {
  using O = ExampleOptions;
  const auto schema = OptionsSchema<O>()
                          .add("sparsity", &O::sparsity, "fraction removed")
                          .add("steps", &O::steps, "pruning steps", {}, "one per epoch")
                          .add("global", &O::global, "rank across layers")
                          .add("criterion", &O::criterion, "importance", {"l1", "l2"})
                          .add("levels", &O::levels, "levels")
                          .add("bits", &O::bits, "bits", {}, "the method's default");
  const auto& k = schema.keys();
  ASSERT_EQ(k.size(), 6u);
  EXPECT_EQ(k[0].type, KeyType::kFloat);
  EXPECT_EQ(k[0].default_text, "0.5");
  EXPECT_EQ(k[1].type, KeyType::kInt);
  EXPECT_EQ(k[1].default_text, "3 (one per epoch)");
  EXPECT_EQ(k[2].default_text, "false");
  EXPECT_EQ(k[3].default_text, "l1");
  EXPECT_EQ(k[3].choices, (std::vector<std::string>{"l1", "l2"}));
  EXPECT_EQ(k[4].type, KeyType::kFloatList);
  EXPECT_EQ(k[4].default_text, "[]");
  EXPECT_EQ(k[5].type, KeyType::kInt);
  EXPECT_EQ(k[5].default_text, "the method's default");

  ModifierSettings s;
  s["sparsity"] = 1;  // an integer where a number is expected
  s["criterion"] = "l2";
  s["levels"] = std::vector<int64_t>{1, 2};
  s["bits"] = 4;
  const O o = schema.parse(s, "r.yaml:3: modifier 'prune'");
  EXPECT_EQ(o.sparsity, 1.0);
  EXPECT_EQ(o.steps, 3);
  EXPECT_EQ(o.criterion, "l2");
  EXPECT_EQ(o.levels, (std::vector<double>{1.0, 2.0}));
  ASSERT_TRUE(o.bits.has_value());
  EXPECT_EQ(*o.bits, 4);

  ModifierSettings bad;
  bad["steps"] = 2.5;
  try {
    schema.parse(bad, "r.yaml:3: modifier 'prune'");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "r.yaml:3: modifier 'prune', key 'steps': expected an integer, got a number (2.5)");
  }
  ModifierSettings choice;
  choice["criterion"] = "l3";
  EXPECT_THROW(schema.parse(choice, "x"), Error);
}

// The built-in modifiers' settings reach them typed from the recipe.
TEST(OptionsSchema, RecipeSettingsAreTyped) {
  const Recipe r = qat_recipe(1);
  const ModifierSettings& q = r.modifiers.at(0).settings;
  EXPECT_EQ(std::get<std::string>(q["method"].storage()), "dorefa");
  EXPECT_EQ(std::get<int64_t>(q["weight_bits"].storage()), 4);
  EXPECT_FALSE(q.contains("start_epoch"));  // common keys are fields of ModifierSpec
  const auto o = quantize_modifier_schema().parse(q, "<qat>");
  EXPECT_EQ(o.method, "dorefa");
  EXPECT_EQ(o.weight_bits, 4);
  EXPECT_EQ(o.activation_bits, 4);
  // The methods' own keys join the modifier's: dorefa's activation_clip, bnn's clip_latent_weights.
  std::vector<std::string> keys;
  for (const KeySpec& k : quantize_modifier_keys()) keys.push_back(k.name);
  EXPECT_NE(std::find(keys.begin(), keys.end(), "activation_clip"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "clip_latent_weights"), keys.end());
  const ModifierSettings& f = r.modifiers.at(1).settings;
  EXPECT_EQ(std::get<double>(f["freeze_bn_epoch"].storage()), 2.0);  // a number key stores a double
}

// ---------------------------------------------------------------- model loader

TEST(ModelLoader, ZooCheckpointTorchScriptAndErrors) {
  ModelSource zoo;
  zoo.name = "lenet5";
  zoo.seed = 7;
  zoo.input_shape = {1, 1, 28, 28};
  Graph a = load_model(zoo);
  ZooOptions zo;
  zo.seed = 7;
  zo.input_shape = {1, 1, 28, 28};
  Graph b = build_model("lenet5", zo);
  for (const auto& n : a.nodes())
    for (const auto& kv : n.params) EXPECT_TRUE(kv.second.equal(b.node(n.name).params.at(kv.first))) << n.name;

  const std::string dir = out_dir("loader");
  const std::string ckpt = join_path(dir, "m.h5");
  save_checkpoint(ckpt, a, "model: {name: lenet5}\n", "{\"test_top1\": 0.5}");
  ModelSource file;
  file.file = ckpt;
  ModelMetadata meta;
  Graph c = load_model(file, &meta);
  EXPECT_EQ(meta.kind, ModelMetadata::Kind::kCheckpoint);
  EXPECT_EQ(meta.recipe, "model: {name: lenet5}\n");
  EXPECT_EQ(graph_to_json(c), graph_to_json(a));
  // The HDF5 signature makes a checkpoint whatever the file is called.
  const std::string renamed = join_path(dir, "m.bin");
  write_file_atomic(renamed, read_file(ckpt));
  file.file = renamed;
  load_model(file, &meta);
  EXPECT_EQ(meta.kind, ModelMetadata::Kind::kCheckpoint);

  auto usage_error = [](const ModelSource& s) {
    try {
      load_model(s);
    } catch (const Error& e) {
      return e.kind() == ErrorKind::kUsage ? std::string(e.what()) : "not a usage error: " + std::string(e.what());
    }
    return std::string("no error");
  };
  ModelSource none;
  EXPECT_NE(usage_error(none).find("either a zoo name or a file"), std::string::npos);
  ModelSource both = zoo;
  both.file = ckpt;
  EXPECT_NE(usage_error(both).find("either a zoo name or a file"), std::string::npos);
  ModelSource unknown;
  unknown.name = "resnet21";
  EXPECT_NE(usage_error(unknown).find("unknown model 'resnet21'"), std::string::npos);
  ModelSource missing;
  missing.file = join_path(dir, "none.h5");
  EXPECT_NE(usage_error(missing).find("does not exist"), std::string::npos);
  const std::string ts = join_path(dir, "model.pt");
  write_file_atomic(ts, "not a model");
  ModelSource torchscript;
  torchscript.file = ts;
  EXPECT_NE(usage_error(torchscript).find("needs an input shape"), std::string::npos);
}

}  // namespace
}  // namespace whittle::runner
