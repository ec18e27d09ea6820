// Pruning the torchvision classifiers the TorchScript importer reads (ResNet-18, MobileNetV2,
// VGG-11-BN, SqueezeNet, ShuffleNetV2, DenseNet-121, EfficientNet-B0, RegNetY-400MF, GoogLeNet,
// MobileNetV3-Small; written by make_torchscript_models.py):
// 30 % of the channels globally by L1. Each still runs with the same output shape, its MACs fall,
// and its checkpoint reloads with identical outputs.

#include <gtest/gtest.h>

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

INSTANTIATE_TEST_SUITE_P(Models, PruneTorchvision,
                         ::testing::Values("resnet18", "mobilenet_v2", "vgg11_bn", "squeezenet1_0", "shufflenet_v2_x0_5",
                                           "densenet121", "efficientnet_b0", "regnet_y_400mf", "googlenet",
                                           "mobilenet_v3_small"));

}  // namespace
}  // namespace whittle::prune
