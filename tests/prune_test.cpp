// Channel pruning: dependency groups through residual adds, depthwise and grouped convolutions,
// flatten, concatenation; removal against the masked model (the same weights with the removed
// channels' filters and biases zeroed); the β leak folded into the next bias; criteria and
// targets. The values are the ones worked by hand in issue 13.

#include <ATen/core/grad_mode.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "fuse/qat_batchnorm.h"
#include "graph/graph_module.h"
#include "graph/zoo.h"
#include "prune/prune.h"
#include "support.h"
#include "test_models.h"

namespace whittle::prune {
namespace {

using test::make;

Node conv(const std::string& name, const std::string& in, int64_t cin, int64_t cout, int64_t k = 1, int64_t groups = 1,
          int64_t padding = 0, bool bias = true) {
  Node n = make(name, "conv2d", {in}, {{"groups", groups}, {"padding", std::vector<int64_t>{padding, padding}}});
  n.params.set("weight", at::randn({cout, cin / groups, k, k}));
  if (bias) n.params.set("bias", at::randn({cout}));
  return n;
}

// The group that holds `node`'s channels on `role`.
const DependencyGroup& group_of(const std::vector<DependencyGroup>& groups, const std::string& node, ChannelRole role) {
  for (const auto& g : groups)
    for (const auto& m : g.members)
      if (m.node == node && m.role == role) return g;
  throw std::runtime_error("no group for " + node);
}

const Member& member(const DependencyGroup& g, const std::string& node, ChannelRole role) {
  for (const auto& m : g.members)
    if (m.node == node && m.role == role) return m;
  throw std::runtime_error("no member " + node);
}

// The plan removing `channels` (group channel indices) from the group holding node's output.
Plan plan_removing(const Graph& g, const std::string& node, std::vector<int64_t> channels, ChannelRole role = ChannelRole::kOutput) {
  Plan p;
  p.groups = dependency_groups(g);
  p.remove.assign(p.groups.size(), {});
  const DependencyGroup& target = group_of(p.groups, node, role);
  p.remove[static_cast<size_t>(target.id)] = std::move(channels);
  return p;
}

// The masked reference: `g` with the producers' output channels `positions` zeroed (weight rows
// and bias), for each (producer, positions).
Graph masked(const Graph& g, const std::vector<std::pair<std::string, std::vector<int64_t>>>& zero) {
  Graph m = g.clone();
  for (const auto& [name, positions] : zero) {
    Node& n = m.node(name);
    for (int64_t p : positions) {
      n.params.at("weight").select(0, p).zero_();
      if (const at::Tensor* b = n.params.find("bias")) b->select(0, p).zero_();
    }
  }
  return m;
}

at::Tensor run(const Graph& g, const at::Tensor& x) {
  GraphModule m(g.clone());
  m->eval();
  at::NoGradGuard ng;
  return m->forward(x);
}

class PruneTest : public test::SeededTest {};

// stem 3→8 → convA 8→8 → convB 8→8 → add(stem, convB) → head 8→4, no BN.
Graph residual() {
  Graph g;
  g.add_input("x", {1, 3, 6, 6});
  g.add_node(conv("stem", "x", 3, 8, 3, 1, 1));
  g.add_node(conv("convA", "stem", 8, 8, 3, 1, 1));
  g.add_node(conv("convB", "convA", 8, 8, 3, 1, 1));
  g.add_node(make("add", "add", {"stem", "convB"}));
  g.add_node(conv("head", "add", 8, 4, 1));
  g.set_outputs({"head"});
  return g;
}

TEST_F(PruneTest, ResidualChainIsOneGroup) {
  const Graph g = residual();
  const auto groups = dependency_groups(g);
  const DependencyGroup& r = group_of(groups, "stem", ChannelRole::kOutput);
  EXPECT_EQ(r.channels, 8);
  std::set<std::pair<std::string, ChannelRole>> members;
  for (const auto& m : r.members) members.emplace(m.node, m.role);
  const std::set<std::pair<std::string, ChannelRole>> expected{{"stem", ChannelRole::kOutput},
                                                               {"convB", ChannelRole::kOutput},
                                                               {"convA", ChannelRole::kInput},
                                                               {"head", ChannelRole::kInput}};
  EXPECT_EQ(members, expected) << r.to_string();
  EXPECT_EQ(r.prunable(), 8);
  // Ratio 0.25 on the group: 6 channels left in every member (not 4 or 5).
  Config c;
  c.sparsity = 0.25;
  Graph pruned = g.clone();
  remove_channels(pruned, make_plan(pruned, c));
  EXPECT_EQ(pruned.node("stem").params.at("weight").size(0), 6);
  EXPECT_EQ(pruned.node("convB").params.at("weight").size(0), 6);
  EXPECT_EQ(pruned.node("convA").params.at("weight").size(1), 6);
  EXPECT_EQ(pruned.node("head").params.at("weight").size(1), 6);
  EXPECT_EQ(pruned.node("convA").params.at("weight").size(0), 6);  // convA's own output group: 8 → 6
  EXPECT_EQ(pruned.node("head").params.at("weight").size(0), 4);   // the graph output stays
  // Pruned layers remember their width before pruning (whittle inspect shows "6 of 8").
  EXPECT_EQ(pruned.node("stem").attr_int("unpruned_channels"), 8);
  EXPECT_EQ(pruned.node("convA").attr_int("unpruned_channels"), 8);
  EXPECT_FALSE(pruned.node("head").has_attr("unpruned_channels"));
}

TEST_F(PruneTest, RemovingThroughConvBRemovesTheSameIndicesEverywhere) {
  const Graph g = residual();
  Graph pruned = g.clone();
  // Group channels are in first-appearance order (the stem's outputs), so channel k is position k.
  const Plan p = plan_removing(g, "convB", {1, 5});
  remove_channels(pruned, p, /*fold_constant_outputs=*/false);
  const auto keep = [](const at::Tensor& t, int64_t axis) {
    return at::index_select(t, axis, at::tensor(std::vector<int64_t>{0, 2, 3, 4, 6, 7}));
  };
  EXPECT_TRUE(pruned.node("stem").params.at("weight").equal(keep(g.node("stem").params.at("weight"), 0)));
  EXPECT_TRUE(pruned.node("stem").params.at("bias").equal(keep(g.node("stem").params.at("bias"), 0)));
  EXPECT_TRUE(pruned.node("convB").params.at("weight").equal(keep(g.node("convB").params.at("weight"), 0)));
  EXPECT_TRUE(pruned.node("convA").params.at("weight").equal(keep(g.node("convA").params.at("weight"), 1)));
  EXPECT_TRUE(pruned.node("head").params.at("weight").equal(keep(g.node("head").params.at("weight"), 1)));
  const at::Tensor x = at::randn({2, 3, 6, 6});
  const Graph ref = masked(g, {{"stem", {1, 5}}, {"convB", {1, 5}}});
  EXPECT_TRUE(test::all_close(run(pruned, x), run(ref, x), 1e-6, 1e-6));
}

TEST_F(PruneTest, DepthwiseIsOnlyGroupsEqualInEqualOut) {
  auto ties = [](int64_t cin, int64_t cout, int64_t groups) {
    Node n = conv("c", "x", cin, cout, 3, groups);
    return channel_ties(n);
  };
  EXPECT_TRUE(ties(3, 1, 1).empty());   // Conv(3→1): no
  EXPECT_TRUE(ties(1, 8, 1).empty());   // Conv(1→8, g=1): no
  EXPECT_EQ(ties(4, 8, 4), (std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3, 3}));  // multiplier 2
  EXPECT_EQ(ties(8, 8, 8), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));  // depthwise
  EXPECT_TRUE(ties(8, 8, 2).empty());   // grouped, 4 inputs a group: independent outputs
}

TEST_F(PruneTest, DepthwiseChannelGoesWithItsProducer) {
  Graph g;
  g.add_input("x", {1, 3, 6, 6});
  g.add_node(conv("pw", "x", 3, 8));
  g.add_node(conv("dw", "pw", 8, 8, 3, 8, 1));
  g.add_node(conv("out", "dw", 8, 2));
  g.set_outputs({"out"});
  const auto groups = dependency_groups(g);
  const DependencyGroup& d = group_of(groups, "dw", ChannelRole::kOutput);
  EXPECT_EQ(&d, &group_of(groups, "pw", ChannelRole::kOutput)) << "depthwise outputs are the producer's channels";
  Graph pruned = g.clone();
  remove_channels(pruned, plan_removing(g, "pw", {3}), false);
  EXPECT_EQ(pruned.node("dw").params.at("weight").sizes(), (at::IntArrayRef{7, 1, 3, 3}));
  EXPECT_EQ(pruned.node("dw").attr_int("groups"), 7);
  EXPECT_EQ(pruned.node("pw").params.at("weight").size(0), 7);
  EXPECT_EQ(pruned.node("out").params.at("weight").size(1), 7);
  const at::Tensor x = at::randn({2, 3, 6, 6});
  EXPECT_TRUE(test::all_close(run(pruned, x), run(masked(g, {{"pw", {3}}, {"dw", {3}}}), x), 1e-6, 1e-6));
}

TEST_F(PruneTest, ChannelMultiplierRemovesBothOutputsOfAnInput) {
  Graph g;
  g.add_input("x", {1, 3, 6, 6});
  g.add_node(conv("pw", "x", 3, 4));
  g.add_node(conv("mult", "pw", 4, 8, 3, 4, 1));  // Conv(4→8, g=4)
  g.add_node(conv("out", "mult", 8, 2));
  g.set_outputs({"out"});
  const auto groups = dependency_groups(g);
  const DependencyGroup& grp = group_of(groups, "pw", ChannelRole::kOutput);
  const Member& mo = member(grp, "mult", ChannelRole::kOutput);
  EXPECT_EQ(mo.positions[1], (std::vector<int64_t>{2, 3}));  // input channel 1 ↔ outputs {2, 3}
  Graph pruned = g.clone();
  remove_channels(pruned, plan_removing(g, "pw", {1}), false);
  EXPECT_EQ(pruned.node("mult").params.at("weight").sizes(), (at::IntArrayRef{6, 1, 3, 3}));  // Conv(3→6, g=3)
  EXPECT_EQ(pruned.node("mult").attr_int("groups"), 3);
  EXPECT_EQ(pruned.node("out").params.at("weight").size(1), 6);
  const at::Tensor x = at::randn({2, 3, 6, 6});
  // 1e-5, not 1e-6: the grouped convolutions of 4 and 3 groups may run different oneDNN kernels
  // (with OMP_NUM_THREADS=1 they differ by up to 4e-6 on outputs of order 1).
  EXPECT_TRUE(test::all_close(run(pruned, x), run(masked(g, {{"pw", {1}}, {"mult", {2, 3}}}), x), 1e-5, 1e-5));
}

TEST_F(PruneTest, FlattenRemovesTheChannelsFeatures) {
  Graph g;
  g.add_input("x", {1, 3, 2, 2});
  g.add_node(conv("c", "x", 3, 4));  // 4×2×2
  g.add_node(make("flat", "flatten", {"c"}));
  Node fc = make("fc", "linear", {"flat"});
  fc.params.set("weight", at::randn({10, 16}));
  fc.params.set("bias", at::randn({10}));
  g.add_node(fc);
  g.set_outputs({"fc"});
  const auto groups = dependency_groups(g);
  const Member& m = member(group_of(groups, "c", ChannelRole::kOutput), "fc", ChannelRole::kInput);
  EXPECT_EQ(m.positions[2], (std::vector<int64_t>{8, 9, 10, 11}));
  Graph pruned = g.clone();
  remove_channels(pruned, plan_removing(g, "c", {2}), false);
  EXPECT_EQ(pruned.node("fc").params.at("weight").sizes(), (at::IntArrayRef{10, 12}));  // Linear(12→10)
  const at::Tensor x = at::randn({3, 3, 2, 2});
  EXPECT_TRUE(test::all_close(run(pruned, x), run(masked(g, {{"c", {2}}}), x), 1e-6, 1e-6));
}

TEST_F(PruneTest, BetaLeakFoldsIntoTheNextBias) {
  Graph g;
  g.add_input("x", {1, 2, 3, 3});
  g.add_node(conv("c1", "x", 2, 2));
  Node bn = make("bn", "batch_norm", {"c1"});
  bn.params.set("weight", at::tensor({1.5f, 2.0f}));
  bn.params.set("bias", at::tensor({0.5f, 1.0f}));
  bn.buffers.set("running_mean", at::tensor({0.2f, 0.0f}));
  bn.buffers.set("running_var", at::tensor({1.0f, 1.0f}));
  g.add_node(bn);
  g.add_node(make("relu", "relu", {"bn"}));
  Node c2 = conv("c2", "relu", 2, 1);
  c2.params.set("weight", at::tensor({0.7f, 3.0f}).reshape({1, 2, 1, 1}));
  c2.params.set("bias", at::tensor({0.25f}));
  g.add_node(c2);
  g.set_outputs({"c2"});
  Graph pruned = g.clone();
  const Report r = remove_channels(pruned, plan_removing(g, "c1", {1}));
  // BN of a zero input on channel 1: γ·(0 − 0)/√(1 + ε) + β = 1; ReLU keeps 1; weight 3: bias + 3.
  EXPECT_NEAR(pruned.node("c2").params.at("bias").item<float>(), 0.25f + 3.0f, 1e-6) << r.summary();
  EXPECT_EQ(r.folded.size(), 1u) << r.summary();
  const at::Tensor x = at::randn({4, 2, 3, 3});
  EXPECT_TRUE(test::all_close(run(pruned, x), run(masked(g, {{"c1", {1}}}), x), 1e-6, 1e-6));
  // The BN statistics were sliced with the channel.
  EXPECT_EQ(pruned.node("bn").buffers.at("running_mean").size(0), 1);
}

TEST_F(PruneTest, BetaLeakThroughZeroPaddingIsReportedNotFolded) {
  Graph g;
  g.add_input("x", {1, 2, 4, 4});
  g.add_node(conv("c1", "x", 2, 2));
  Node bn = make("bn", "batch_norm", {"c1"});
  bn.params.set("weight", at::ones({2}));
  bn.params.set("bias", at::ones({2}));
  bn.buffers.set("running_mean", at::zeros({2}));
  bn.buffers.set("running_var", at::ones({2}));
  g.add_node(bn);
  g.add_node(conv("c2", "bn", 2, 1, 3, 1, 1));  // 3×3, zero padding 1
  g.set_outputs({"c2"});
  const float before = g.node("c2").params.at("bias").item<float>();
  Graph pruned = g.clone();
  const Report r = remove_channels(pruned, plan_removing(g, "c1", {0}));
  EXPECT_TRUE(r.folded.empty());
  ASSERT_EQ(r.not_folded.size(), 1u) << r.summary();
  EXPECT_NE(r.not_folded[0].find("c2"), std::string::npos);
  EXPECT_EQ(pruned.node("c2").params.at("bias").item<float>(), before);
}

TEST_F(PruneTest, ConcatOfTheSameTensorTwice) {
  Graph g;
  g.add_input("x", {1, 3, 4, 4});
  g.add_node(conv("a", "x", 3, 4));
  g.add_node(make("cat", "cat", {"a", "a"}, {{"dim", int64_t{1}}}));
  g.add_node(conv("out", "cat", 8, 2));
  g.set_outputs({"out"});
  const auto groups = dependency_groups(g);
  const Member& m = member(group_of(groups, "a", ChannelRole::kOutput), "out", ChannelRole::kInput);
  EXPECT_EQ(m.positions[1], (std::vector<int64_t>{1, 5}));
  Graph pruned = g.clone();
  remove_channels(pruned, plan_removing(g, "a", {1}), false);
  EXPECT_EQ(pruned.node("out").params.at("weight").size(1), 6);
  const at::Tensor x = at::randn({2, 3, 4, 4});
  EXPECT_TRUE(test::all_close(run(pruned, x), run(masked(g, {{"a", {1}}}), x), 1e-6, 1e-6));
}

TEST_F(PruneTest, GraphInputsAndOutputsAreFixed) {
  const Graph g = test::small_net();
  const auto groups = dependency_groups(g);
  const DependencyGroup& out = group_of(groups, "classifier", ChannelRole::kOutput);
  EXPECT_EQ(out.prunable(), 0);
  EXPECT_NE(out.fixed_reason.find("graph output"), std::string::npos) << out.fixed_reason;
  const DependencyGroup& in = group_of(groups, "features.0", ChannelRole::kInput);
  EXPECT_EQ(in.prunable(), 0);
  // The conv's group reaches the BN and the linear's 16 features per channel.
  const DependencyGroup& c = group_of(groups, "features.0", ChannelRole::kOutput);
  EXPECT_EQ(member(c, "classifier", ChannelRole::kInput).positions[0].size(), 16u);
  EXPECT_EQ(member(c, "features.1", ChannelRole::kChannel).positions[3], std::vector<int64_t>{3});
}

TEST_F(PruneTest, GroupedConvolutionKeepsEqualCountsPerGroup) {
  Graph g;
  g.add_input("x", {1, 3, 4, 4});
  g.add_node(conv("a", "x", 3, 8));
  g.add_node(conv("grouped", "a", 8, 8, 1, 2));  // 2 groups of 4 inputs
  g.add_node(conv("out", "grouped", 8, 2));
  g.set_outputs({"out"});
  const auto groups = dependency_groups(g);
  const DependencyGroup& grp = group_of(groups, "a", ChannelRole::kOutput);
  EXPECT_EQ(grp.segments, 2);
  Config c;
  c.sparsity = 0.5;
  c.targets = {"a"};
  Graph pruned = g.clone();
  const Plan p = make_plan(pruned, c);
  const auto& rm = p.remove[static_cast<size_t>(grp.id)];
  ASSERT_EQ(rm.size(), 4u);
  EXPECT_EQ(std::count_if(rm.begin(), rm.end(), [](int64_t k) { return k < 4; }), 2);  // 2 from each group
  remove_channels(pruned, p);
  EXPECT_EQ(pruned.node("grouped").params.at("weight").sizes(), (at::IntArrayRef{8, 2, 1, 1}));
  EXPECT_EQ(pruned.node("grouped").attr_int("groups"), 2);
}

// Targets name layers; a group is pruned when one of its producers is a target and none is ignored.
// Naming one convolution of a residual pair used to prune nothing (every member had to be named).
TEST_F(PruneTest, ATargetPrunesItsWholeGroupAndAnIgnoredMemberKeepsIt) {
  Graph g;
  g.add_input("x", {1, 3, 4, 4});
  g.add_node(conv("a", "x", 3, 8));
  g.add_node(conv("b", "a", 8, 8));
  g.add_node(make("sum", "add", {"a", "b"}, {}));
  g.add_node(conv("c", "sum", 8, 8));
  g.add_node(conv("out", "c", 8, 2));
  g.set_outputs({"out"});
  Config cfg;
  cfg.sparsity = 0.5;
  cfg.targets = {"b"};
  Graph pruned = g.clone();
  const Plan p = make_plan(pruned, cfg);
  EXPECT_EQ(p.removed(), 4);  // the residual group {a, b}: 4 of its 8 channels
  remove_channels(pruned, p);
  EXPECT_EQ(pruned.node("a").params.at("weight").size(0), 4);
  EXPECT_EQ(pruned.node("b").params.at("weight").size(0), 4);
  EXPECT_EQ(pruned.node("c").params.at("weight").size(0), 8);  // not a target
  // Ignoring a member keeps the group whole, saying why; the other targets are still pruned.
  cfg.targets = {};
  cfg.ignore = {"a"};
  const Plan q = make_plan(g, cfg);
  EXPECT_EQ(q.removed(), 4);  // c's 8 → 4 only
  const std::string skipped = ::testing::PrintToString(q.skipped);
  EXPECT_NE(skipped.find("(a, b): layer 'a' is ignored"), std::string::npos) << skipped;
  // A group none of whose producers is a target says so.
  cfg.ignore = {};
  cfg.targets = {"c"};
  const Plan r = make_plan(g, cfg);
  EXPECT_EQ(r.removed(), 4);
  EXPECT_NE(::testing::PrintToString(r.skipped).find("(a, b): none of its layers is among the targets"), std::string::npos)
      << ::testing::PrintToString(r.skipped);
}

// A concatenation of a (4 channels) and b (12) is one group of 16: sparsity 0.5 removes 8, 2 from a
// and 6 from b, ranked within each. With the layers' original widths (as the prune modifier's steps
// give them) the group's original count is the sum of the concatenated layers' (it was a's alone:
// 16 − (4 − 2) = 14 removed, 88 %).
TEST_F(PruneTest, ConcatenatedLayersEachGiveTheirShare) {
  Graph g;
  g.add_input("x", {1, 3, 4, 4});
  g.add_node(conv("a", "x", 3, 4));
  g.add_node(conv("b", "x", 3, 12));
  g.add_node(make("cat", "cat", {"a", "b"}, {{"dim", int64_t{1}}}));
  g.add_node(conv("out", "cat", 16, 2));
  g.set_outputs({"out"});
  Config cfg;
  cfg.sparsity = 0.5;
  cfg.targets = {"a", "b"};
  for (const bool with_original : {false, true}) {
    if (with_original) cfg.original_channels = {{"a", 4}, {"b", 12}, {"out", 2}};
    Graph pruned = g.clone();
    const Plan p = make_plan(pruned, cfg);
    EXPECT_EQ(p.removed(), 8) << with_original;
    remove_channels(pruned, p);
    EXPECT_EQ(pruned.node("a").params.at("weight").size(0), 2) << with_original;
    EXPECT_EQ(pruned.node("b").params.at("weight").size(0), 6) << with_original;
  }
}

// Network slimming (bn_scale) on a model without batch norms: no group has a γ to rank by, so none
// is pruned (it used to remove channels picked by ties of infinite scores), each saying why.
TEST_F(PruneTest, BnScaleWithoutBatchNormPrunesNothingAndSaysWhy) {
  Graph g;
  g.add_input("x", {1, 3, 4, 4});
  g.add_node(conv("a", "x", 3, 8));
  g.add_node(conv("out", "a", 8, 2));
  g.set_outputs({"out"});
  Config cfg;
  cfg.sparsity = 0.5;
  cfg.scoring.criterion = Criterion::kBnScale;
  const Plan p = make_plan(g, cfg);
  EXPECT_EQ(p.removed(), 0);
  EXPECT_NE(::testing::PrintToString(p.skipped).find("(a): no normalization (batch_norm γ) to rank its channels by"),
            std::string::npos) << ::testing::PrintToString(p.skipped);
}

// a: conv 3→8 → channel_shuffle(2) → grouped: conv 8→8, 2 groups → out. The shuffle's output k·2 + i
// is a's channel i·4 + k, so a's channels {k, 4 + k} are one group channel k (the shuffle stays a
// shuffle); after it they are positions {2k, 2k + 1}, inside grouped's group k / 2.
TEST_F(PruneTest, ChannelShuffleBindsPositionKOfEveryGroup) {
  Graph g;
  g.add_input("x", {1, 3, 4, 4});
  g.add_node(conv("a", "x", 3, 8));
  g.add_node(make("shuffle", "channel_shuffle", {"a"}, {{"groups", int64_t{2}}}));
  g.add_node(conv("grouped", "shuffle", 8, 8, 1, 2));
  g.add_node(conv("out", "grouped", 8, 2));
  g.set_outputs({"out"});
  const auto groups = dependency_groups(g);
  const DependencyGroup& grp = group_of(groups, "a", ChannelRole::kOutput);
  ASSERT_EQ(grp.channels, 4) << grp.to_string();
  EXPECT_EQ(grp.prunable(), 4);
  for (int64_t k = 0; k < 4; ++k) {
    EXPECT_EQ(member(grp, "a", ChannelRole::kOutput).positions[static_cast<size_t>(k)], (std::vector<int64_t>{k, 4 + k}));
    EXPECT_EQ(member(grp, "grouped", ChannelRole::kInput).positions[static_cast<size_t>(k)],
              (std::vector<int64_t>{2 * k, 2 * k + 1}));
  }
  EXPECT_EQ(grp.segments, 2);
  EXPECT_EQ(grp.segment, (std::vector<int64_t>{0, 0, 1, 1}));
  // Removing group channels 1 and 2 removes a's outputs {1, 2, 5, 6}; grouped keeps 2 inputs per group.
  Graph pruned = g.clone();
  remove_channels(pruned, plan_removing(g, "a", {1, 2}), false);
  EXPECT_EQ(pruned.node("a").params.at("weight").size(0), 4);
  EXPECT_EQ(pruned.node("shuffle").attr_int("groups"), 2);
  EXPECT_EQ(pruned.node("grouped").params.at("weight").sizes(), (at::IntArrayRef{8, 2, 1, 1}));
  EXPECT_EQ(pruned.node("grouped").attr_int("groups"), 2);
  const at::Tensor x = at::randn({2, 3, 4, 4});
  EXPECT_TRUE(test::all_close(run(pruned, x), run(masked(g, {{"a", {1, 2, 5, 6}}}), x), 1e-6, 1e-6));
  // A ratio keeps equal counts in grouped's two groups: 0.5 removes one channel of {0, 1} and one of {2, 3}.
  Config c;
  c.sparsity = 0.5;
  c.targets = {"a"};
  const Plan p = make_plan(g, c);
  const auto& rm = p.remove[static_cast<size_t>(grp.id)];
  ASSERT_EQ(rm.size(), 2u);
  EXPECT_LT(rm[0], 2);
  EXPECT_GE(rm[1], 2);
}

// cat(shuffle(2) of P's 8 channels, Q's 4) into R (12 → 12, 2 groups): P's units have 2 positions in
// R, Q's 1, so equal counts per segment would not give R equal groups: the group is fixed (with
// the reason) and pruning the rest of the model still works.
TEST_F(PruneTest, ShuffledAndPlainChannelsInOneGroupedConvAreLeftFixed) {
  Graph g;
  g.add_input("x", {1, 3, 4, 4});
  g.add_node(conv("P", "x", 3, 8));
  g.add_node(make("shuffle", "channel_shuffle", {"P"}, {{"groups", int64_t{2}}}));
  g.add_node(conv("Q", "x", 3, 4));
  g.add_node(make("cat", "cat", {"shuffle", "Q"}, {{"dim", int64_t{1}}}));
  g.add_node(conv("R", "cat", 12, 12, 1, 2));
  g.add_node(conv("out", "R", 12, 2));
  g.set_outputs({"out"});
  const auto groups = dependency_groups(g);
  const DependencyGroup& grp = group_of(groups, "P", ChannelRole::kOutput);
  EXPECT_EQ(grp.prunable(), 0) << grp.to_string();
  EXPECT_NE(grp.fixed_reason.find("R"), std::string::npos) << grp.fixed_reason;
  Config c;
  c.sparsity = 0.5;
  Graph pruned = g.clone();
  const Report r = remove_channels(pruned, make_plan(pruned, c));
  EXPECT_EQ(pruned.node("R").params.at("weight").size(0), 6) << r.summary();  // R's own outputs: 12 → 6
  EXPECT_EQ(pruned.node("R").params.at("weight").size(1), 6);                 // its inputs untouched
  EXPECT_EQ(pruned.node("P").params.at("weight").size(0), 8);
}

// micronet's nin_gc: every group through its five channel shuffles is prunable but the
// classifier's; half the channels by L1 keeps every conv's groups and shrinks the MACs.
TEST_F(PruneTest, NinGcPrunesThroughEveryShuffle) {
  GraphModule m(build_model("nin_gc"));
  const auto groups = dependency_groups(m->graph());
  for (const auto& grp : groups) {
    const auto producers = grp.producers();
    if (producers == std::vector<std::string>{"model.10.conv"}) {
      EXPECT_EQ(grp.prunable(), 0);
      continue;
    }
    if (producers.empty()) continue;  // the graph input
    EXPECT_EQ(grp.prunable(), grp.channels) << grp.to_string();
  }
  // After shuffle(32) before model.9, model.8's 1024 outputs are 32 channels of 32 positions, in
  // model.9's 8 groups.
  const DependencyGroup& g8 = group_of(groups, "model.8.conv", ChannelRole::kOutput);
  EXPECT_EQ(g8.channels, 32);
  EXPECT_EQ(g8.segments, 8);
  m->eval();
  const at::Tensor x = at::randn({2, 3, 32, 32});
  const NodeCost before = graph_cost(m->graph());
  Config c;
  c.sparsity = 0.5;
  const Report r = prune(m, c);
  EXPECT_EQ(r.skipped.size(), 2u) << r.summary();  // the input's and the classifier's groups
  EXPECT_LT(r.after.macs, before.macs * 0.3) << r.summary();
  const Graph& pg = m->graph();
  for (const auto& [name, groups_attr] : std::vector<std::pair<std::string, int64_t>>{
           {"model.1.conv", 2}, {"model.4.conv", 16}, {"model.8.conv", 32}, {"model.9.conv", 8}}) {
    EXPECT_EQ(pg.node(name).attr_int("groups"), groups_attr) << name;
    EXPECT_EQ(pg.node(name).params.at("weight").size(0), build_model("nin_gc").node(name).params.at("weight").size(0) / 2)
        << name;
  }
  m->eval();
  at::NoGradGuard ng;
  EXPECT_EQ(m->forward(x).sizes(), (at::IntArrayRef{2, 10}));
}

TEST_F(PruneTest, CriteriaRankByHand) {
  Graph g;
  g.add_input("x", {1, 1, 1, 1});
  Node a = conv("a", "x", 1, 3, 1, 1, 0, false);
  a.params.set("weight", at::tensor({1.0f, -3.0f, 2.0f}).reshape({3, 1, 1, 1}));
  g.add_node(a);
  Node b = conv("b", "a", 3, 1, 1, 1, 0, false);
  b.params.set("weight", at::tensor({0.5f, 0.5f, -4.0f}).reshape({1, 3, 1, 1}));
  g.add_node(b);
  g.set_outputs({"b"});
  const auto groups = dependency_groups(g);
  const DependencyGroup& grp = group_of(groups, "a", ChannelRole::kOutput);
  ScoreOptions o;
  o.criterion = Criterion::kL1;
  EXPECT_EQ(score(g, grp, o), (std::vector<double>{1.5, 3.5, 6.0}));  // |a row| + |b column|
  o.criterion = Criterion::kL2;
  EXPECT_EQ(score(g, grp, o), (std::vector<double>{1.25, 9.25, 20.0}));
  o.mean_over_members = true;
  EXPECT_EQ(score(g, grp, o), (std::vector<double>{0.625, 4.625, 10.0}));
  o = {};
  o.criterion = Criterion::kFpgm;  // distances between the filters 1, −3, 2: Σ|w_c − w_j|
  EXPECT_EQ(score(g, grp, o), (std::vector<double>{5.0, 9.0, 6.0}));
  o.criterion = Criterion::kBnScale;  // no BN in this group: not ranked
  for (double s : score(g, grp, o)) EXPECT_TRUE(std::isinf(s));
}

// bn_scale ranks a group by its BN's |γ|: a batch_norm's weight, and the same γ once QAT has
// folded the BN into its conv (conv_bn_qat's bn_weight), which the registry names (norm_scale).
TEST_F(PruneTest, BnScaleRanksGammaBeforeAndAfterQatFolding) {
  Graph g;
  g.add_input("x", {2, 1, 2, 2});
  g.add_node(conv("a", "x", 1, 3));
  Node bn = make("bn", "batch_norm", {"a"});
  bn.params.set("weight", at::tensor({0.2f, -0.9f, 0.5f}));
  bn.params.set("bias", at::zeros({3}));
  bn.buffers.set("running_mean", at::zeros({3}));
  bn.buffers.set("running_var", at::ones({3}));
  g.add_node(bn);
  g.add_node(conv("b", "bn", 3, 1));
  g.set_outputs({"b"});
  g.infer_shapes();
  ScoreOptions o;
  o.criterion = Criterion::kBnScale;
  const std::vector<double> want{0.2, 0.9, 0.5};
  auto near = [&](const std::vector<double>& got) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-7) << k;
  };
  near(score(g, group_of(dependency_groups(g), "a", ChannelRole::kOutput), o));

  EXPECT_EQ(fuse::prepare_qat_batchnorm(g).fused.size(), 1u);
  ASSERT_EQ(g.node("a").op, "conv_bn_qat");
  near(score(g, group_of(dependency_groups(g), "a", ChannelRole::kOutput), o));
}

// a: conv 1→3 with weights 1, −3, 2; b: conv 3→1 with weights 0.5, 0.5, −4; no biases. On a 1×1
// input x the output is x·Σ_c b_c·a_c, so ∂y/∂a_c = x·b_c and ∂y/∂b_c = x·a_c, and both weights'
// |w·∂y/∂w| are x·(0.5, 1.5, 8).
Graph taylor_pair() {
  Graph g;
  g.add_input("x", {1, 1, 1, 1});
  Node a = conv("a", "x", 1, 3, 1, 1, 0, false);
  a.params.set("weight", at::tensor({1.0f, -3.0f, 2.0f}).reshape({3, 1, 1, 1}).requires_grad_());
  g.add_node(a);
  Node b = conv("b", "a", 3, 1, 1, 1, 0, false);
  b.params.set("weight", at::tensor({0.5f, 0.5f, -4.0f}).reshape({1, 3, 1, 1}).requires_grad_());
  g.add_node(b);
  g.set_outputs({"b"});
  return g;
}

std::vector<float> values(const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous().to(at::kFloat);
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

TEST_F(PruneTest, TaylorSumsWeightTimesGradientOverBatchesByHand) {
  GraphModule m(taylor_pair());
  TaylorScores taylor;
  taylor.attach(m);
  for (float x : {1.0f, 2.0f}) m->forward(at::full({1, 1, 1, 1}, x)).sum().backward();
  // (1 + 2)·(0.5, 1.5, 8): every product and sum here is exact in float, so the comparisons are
  // exact on any thread count and instruction set (checked with OMP_NUM_THREADS=1 and
  // ATEN_CPU_CAPABILITY=default).
  EXPECT_EQ(values(taylor.sums().at("a.weight")), (std::vector<float>{1.5f, 4.5f, 24.0f}));
  EXPECT_EQ(values(taylor.sums().at("b.weight")), (std::vector<float>{1.5f, 4.5f, 24.0f}));
  ScoreOptions o;
  o.criterion = Criterion::kTaylor;
  o.taylor = &taylor;
  const auto groups = dependency_groups(m->graph());
  EXPECT_EQ(score(m->graph(), group_of(groups, "a", ChannelRole::kOutput), o), (std::vector<double>{3.0, 9.0, 48.0}));

  // Attached again (as after a pruning step) and reset: one more batch counts once, not twice.
  taylor.reset();
  taylor.attach(m);
  m->forward(at::full({1, 1, 1, 1}, 1.0f)).sum().backward();
  EXPECT_EQ(values(taylor.sums().at("a.weight")), (std::vector<float>{0.5f, 1.5f, 8.0f}));
  // Detached: the weights' hooks are gone.
  taylor.detach();
  m->forward(at::full({1, 1, 1, 1}, 1.0f)).sum().backward();
  EXPECT_EQ(values(taylor.sums().at("a.weight")), (std::vector<float>{0.5f, 1.5f, 8.0f}));
}

TEST_F(PruneTest, TaylorHooksDoNotKeepTheirWeightsAlive) {
  // A hook holding its weight strongly is a cycle (weight → autograd metadata → hook → weight):
  // the weights replaced by pruning, and the model's at exit, were never freed.
  TaylorScores taylor;
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> weight(at::Tensor().getIntrusivePtr());
  {
    GraphModule m(taylor_pair());
    taylor.attach(m);
    weight = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
        m->graph().node("a").params.at("weight").getIntrusivePtr());
    m->forward(at::ones({1, 1, 1, 1})).sum().backward();
    EXPECT_FALSE(weight.expired());
  }
  EXPECT_TRUE(weight.expired()) << "the model is gone, its weight is still referenced";
  EXPECT_EQ(values(taylor.sums().at("a.weight")), (std::vector<float>{0.5f, 1.5f, 8.0f}));
}

TEST_F(PruneTest, MacsTargetIsMet) {
  Graph g = build_model("resnet20");
  const NodeCost base = graph_cost(g);
  Config c;
  c.target_macs = 0.5;
  const Plan p = make_plan(g, c);
  const Report r = remove_channels(g, p);
  const double ratio = static_cast<double>(r.after.macs) / static_cast<double>(base.macs);
  EXPECT_LE(ratio, 0.5) << r.summary();
  EXPECT_GT(ratio, 0.45) << r.summary();
  GraphModule m(std::move(g));
  m->eval();
  EXPECT_EQ(m->forward(at::randn({2, 3, 32, 32})).sizes(), (at::IntArrayRef{2, 10}));
}

TEST_F(PruneTest, OptionsOutOfRangeAreUsageErrors) {
  const Graph g = residual();
  Config c;
  c.sparsity = 1.0;
  EXPECT_THROW(make_plan(g, c), Error);
  c = {};
  c.target_macs = 0.01;  // the fixed channels alone keep more
  try {
    make_plan(g, c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("cannot be reached"), std::string::npos) << e.what();
  }
  EXPECT_THROW(criterion_from_name("l3"), Error);
}

// A layer-norm-like affine over the last axis of [N, T, D]: y = x·γ + β with γ, β of size D, a
// pass-through op whose channels are its input's (on the last axis here).
void register_feature_affine() {
  if (has_op("test_feature_affine")) return;
  OpTraits t;
  t.kind = "test_feature_affine";
  t.description = "test: x·γ + β over the last axis";
  t.channel_flow = ChannelFlow::kPassThrough;
  t.required_params = {"weight", "bias"};
  t.channel_axis = [](const Node&, const Shape& shape) { return static_cast<int64_t>(shape.size()) - 1; };
  t.channel_tensors = [](const Node&) {
    return std::vector<ChannelTensor>{{"weight", false, ChannelRole::kChannel, 0, false},
                                      {"bias", false, ChannelRole::kChannel, 0, false}};
  };
  t.forward = [](const Node& n, const std::vector<at::Tensor>& in, bool) {
    return std::vector<at::Tensor>{in[0] * n.params.at("weight") + n.params.at("bias")};
  };
  t.infer_shapes = [](const Node&, const std::vector<Shape>& in) { return std::vector<Shape>{in[0]}; };
  register_op(std::move(t));
}

Node linear(const std::string& name, const std::string& in, int64_t fin, int64_t fout) {
  Node n = make(name, "linear", {in});
  n.params.set("weight", at::randn({fout, fin}));
  n.params.set("bias", at::randn({fout}));
  return n;
}

// Linear → affine over D → ReLU → Linear on [N, T, D]: the group is fc1's 6 output features
// (the last axis), not the 5 tokens of dim 1; pruning it removes the same features from the
// affine's γ and β and from fc2's inputs, and the removed features' constant (relu(β)) folds into
// fc2's bias, so the pruned model computes the masked one.
TEST_F(PruneTest, ChannelsOnTheLastAxisOfASequence) {
  register_feature_affine();
  Graph g;
  g.add_input("x", {2, 5, 8});
  g.add_node(linear("fc1", "x", 8, 6));
  Node affine = make("affine", "test_feature_affine", {"fc1"});
  affine.params.set("weight", at::randn({6}));
  affine.params.set("bias", at::rand({6}) + 0.5);  // positive: relu passes the removed features' β on
  g.add_node(affine);
  g.add_node(make("relu", "relu", {"affine"}));
  g.add_node(linear("fc2", "relu", 6, 3));
  g.set_outputs({"fc2"});
  const auto groups = dependency_groups(g);
  const DependencyGroup& d = group_of(groups, "fc1", ChannelRole::kOutput);
  EXPECT_EQ(d.channels, 6) << d.to_string();
  EXPECT_EQ(d.prunable(), 6) << d.to_string();
  std::set<std::pair<std::string, ChannelRole>> members;
  for (const auto& m : d.members) members.emplace(m.node, m.role);
  const std::set<std::pair<std::string, ChannelRole>> expected{
      {"fc1", ChannelRole::kOutput}, {"affine", ChannelRole::kChannel}, {"fc2", ChannelRole::kInput}};
  EXPECT_EQ(members, expected) << d.to_string();
  // The graph input's channels (dim 1) are not the features fc1 reads: fc1's inputs stay.
  EXPECT_EQ(group_of(groups, "fc1", ChannelRole::kInput).prunable(), 0);

  Graph pruned = g.clone();
  const Report r = remove_channels(pruned, plan_removing(g, "fc1", {1, 4}));
  EXPECT_EQ(pruned.node("fc1").params.at("weight").sizes().vec(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(pruned.node("affine").params.at("weight").size(0), 4);
  EXPECT_EQ(pruned.node("affine").params.at("bias").size(0), 4);
  EXPECT_EQ(pruned.node("fc2").params.at("weight").sizes().vec(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(pruned.value("fc2").shape, (Shape{2, 5, 3}));
  EXPECT_EQ(r.folded.size(), 1u) << r.summary();
  const at::Tensor x = at::randn({2, 5, 8});
  EXPECT_TRUE(test::all_close(run(pruned, x), run(masked(g, {{"fc1", {1, 4}}}), x), 1e-5, 1e-5)) << r.summary();

  // A batch_norm there normalizes dim 1 (the 5 tokens), not fc1's features: its statistics are not
  // on the features' axis, so fc1's outputs are left alone.
  Graph b;
  b.add_input("x", {2, 5, 8});
  b.add_node(linear("fc1", "x", 8, 6));
  Node bn = make("bn", "batch_norm", {"fc1"});
  bn.params.set("weight", at::ones({5}));
  bn.params.set("bias", at::zeros({5}));
  bn.buffers.set("running_mean", at::zeros({5}));
  bn.buffers.set("running_var", at::ones({5}));
  b.add_node(bn);
  b.add_node(linear("fc2", "bn", 6, 3));
  b.set_outputs({"fc2"});
  const auto b_groups = dependency_groups(b);
  EXPECT_EQ(group_of(b_groups, "fc1", ChannelRole::kOutput).prunable(), 0) << group_of(b_groups, "fc1", ChannelRole::kOutput).to_string();
}

}  // namespace
}  // namespace whittle::prune
