// Fusion of an imported torchvision ResNet-18 (TorchScript written by the torchscript_models
// fixture): fused and unfused outputs agree and no BN is left.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "fuse/fuse.h"
#include "core/file_util.h"
#include "graph/graph_module.h"
#include "graph/torchscript_import.h"
#include "fuse_test_util.h"
#include "support.h"

namespace whittle::test {
namespace {

namespace f = whittle::fuse;

using ZooFusion = SeededTest;

TEST_F(ZooFusion, ImportedTorchvisionResnet18) {
  const std::string path = join_path(binary_dir(), "testdata/torchscript/resnet18.pt");
  ASSERT_TRUE(is_regular_file(path)) << path << " is written by the torchscript_models fixture";
  Graph g = import_torchscript(path, {1, 3, 224, 224});
  randomize_batchnorm(g);
  GraphModule m(g);
  const at::Tensor x = at::randn({2, 3, 224, 224});
  const at::Tensor before = run_eval(m, x);
  f::Report r = f::fuse_for_inference(m);
  EXPECT_EQ(r.fused.size(), 20u) << r.summary();  // 20 BNs: stem, 8 blocks × 2, 3 downsample
  EXPECT_TRUE(r.skipped.empty()) << r.summary();
  EXPECT_EQ(count_op(m->graph(), "batch_norm"), 0);
  EXPECT_TRUE(same_function(run_eval(m, x), before));
}

}  // namespace
}  // namespace whittle::test
