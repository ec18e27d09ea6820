// Pruning the torchvision classifiers the TorchScript importer reads (ResNet-18, MobileNetV2,
// VGG-11-BN, SqueezeNet, ShuffleNetV2, DenseNet-121, EfficientNet-B0, RegNetY-400MF, GoogLeNet,
// MobileNetV3-Small; written by make_torchscript_models.py):
// 30 % of the channels globally by L1. Each still runs with the same output shape, its MACs fall,
// and its checkpoint reloads with identical outputs.

#include <ATen/core/grad_mode.h>

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/file_util.h"
#include "export/checkpoint.h"
#include "graph/graph_module.h"
#include "graph/torchscript_import.h"
#include "prune/prune.h"
#include "support.h"

namespace whittle::prune {
namespace {

class PruneTorchvision : public ::testing::TestWithParam<const char*> {};

TEST_P(PruneTorchvision, GlobalL1ThirtyPercent) {
  at::manual_seed(0);
  const std::string name = GetParam();
  const std::string path = test::binary_dir() + "/testdata/torchscript/" + name + ".pt";
  GraphModule m(import_torchscript(path, {1, 3, 224, 224}));
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor x = at::randn({2, 3, 224, 224});
  const at::Tensor before = m->forward(x);
  const NodeCost cost0 = graph_cost(m->graph());
  Config c;
  c.global = true;
  c.sparsity = 0.3;
  const Report r = prune(m, c);
  m->eval();
  const at::Tensor after = m->forward(x);
  EXPECT_EQ(after.sizes(), before.sizes()) << name;
  EXPECT_LT(r.after.macs, cost0.macs) << r.summary();
  EXPECT_LT(r.after.params, cost0.params) << r.summary();
  std::cout << name << ": MACs " << cost0.macs << " → " << r.after.macs << ", parameters " << cost0.params << " → "
            << r.after.params << "\n";
  const std::string ck = test::binary_dir() + "/testdata/prune_import/" + name + ".h5";
  make_directories(parent_directory(ck));
  save_checkpoint(ck, m->graph());
  GraphModule reloaded(load_checkpoint(ck).graph);
  reloaded->eval();
  EXPECT_TRUE(reloaded->forward(x).equal(after)) << name;
}

// Concatenations (issue 47 item 7): a DenseNet block or an Inception module is one dependency group
// spanning several layers' outputs. Ranked per layer (the default), every layer loses its share of
// the group's count, so at sparsity 0.3 each convolution keeps C − ⌈0.3·C⌉ of its C channels or
// more; one ranking over the whole group took GoogLeNet branches far below (inception_v3's
// Mixed_6e.branch1x1 went from 192 to 1).
TEST(PruneConcatenations, EachConcatenatedLayerKeepsItsFraction) {
  for (const std::string name : {"densenet121", "googlenet"}) {
    const std::string path = test::binary_dir() + "/testdata/torchscript/" + name + ".pt";
    const Graph g = import_torchscript(path, {1, 3, 224, 224});
    std::map<std::string, int64_t> before;
    for (const Node& n : g.nodes())
      if (n.op == "conv2d") before[n.name] = n.params.at("weight").size(0);
    auto widths_after = [&](bool per_layer) {
      Config c;
      c.sparsity = 0.3;
      c.rank_per_layer = per_layer;
      Graph pruned = g.clone();
      remove_channels(pruned, make_plan(pruned, c));
      std::map<std::string, int64_t> after;
      for (const auto& [layer, width] : before) after[layer] = pruned.node(layer).params.at("weight").size(0);
      return after;
    };
    const auto per_layer = widths_after(true);
    int shrunk = 0;
    for (const auto& [layer, c0] : before) {
      const int64_t floor_keep = c0 - static_cast<int64_t>(std::ceil(0.3 * static_cast<double>(c0) - 1e-9));
      EXPECT_GE(per_layer.at(layer), floor_keep) << name << " " << layer << ": " << c0 << " → " << per_layer.at(layer);
      shrunk += per_layer.at(layer) < c0;
    }
    EXPECT_GT(shrunk, 20) << name;
    // The floor above is a count that holds whatever the scores. Which layer the old ranking over the
    // whole group empties depends on the L1 scores (sums that may round differently with another
    // thread count or instruction set), so only "some layer under half" is asserted; it held with
    // OMP_NUM_THREADS=1 and 2 and ATEN_CPU_CAPABILITY=default, avx2 and the machine's avx512.
    const auto whole_group = widths_after(false);
    int collapsed = 0;
    for (const auto& [layer, c0] : before) collapsed += 2 * whole_group.at(layer) < c0;
    EXPECT_GT(collapsed, 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PruneTorchvision,
                         ::testing::Values("resnet18", "mobilenet_v2", "vgg11_bn", "squeezenet1_0", "shufflenet_v2_x0_5",
                                           "densenet121", "efficientnet_b0", "regnet_y_400mf", "googlenet",
                                           "mobilenet_v3_small"));

}  // namespace
}  // namespace whittle::prune
