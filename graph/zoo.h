#pragma once
// The model zoo: C++ builders of the standard small networks of the compression literature, each
// producing a Graph with freshly initialized weights.
//
// Node names equal the state_dict prefixes of the PyTorch references in
// tests/reference/zoo_models.py ("layer1.0.conv1", "layer2.0.shortcut.0", ...), so a PyTorch
// checkpoint of the same model loads by name. Parameters are float32 CPU tensors with
// requires_grad(true), initialized as torch.nn does (conv/linear weights Kaiming-uniform a = √5,
// biases U(±1/√fan_in); BN weight 1, bias 0, running_mean 0, running_var 1, num_batches_tracked 0),
// or with conv weights drawn as He et al. (2015) do (ZooOptions::weight_init).
// The graph input is named "input"; the single output is the classifier's logits [N, num_classes].
//
// Models (default input shape; parameters and MACs at that shape with 10 classes):
//   lenet5        LeCun et al., 1998, BN after conv1, conv2, fc1, fc2. [1,1,28,28]. 61,932 params, 0.42 M MACs.
//                 conv1(in→6, 5×5, pad 2)-bn1-relu-maxpool2, conv2(6→16, 5×5)-bn2-relu-maxpool2,
//                 flatten, fc1(400→120)-relu, fc2(120→84)-relu, fc3(84→classes). Convs have no bias
//                 (BN follows); no BN on the fully connected layers.
//   vgg_small     VGG-Small of the BNN / LQ-Nets literature (Zhang et al., 2018). [1,3,32,32].
//                 4.66 M params, 607.6 M MACs. conv0..conv5 (3×3, pad 1, no bias; widths 128, 128,
//                 256, 256, 512, 512), each followed by bn<i> and ReLU; 2×2 max pool after the ReLU of
//                 conv1, conv3, conv5; flatten; fc(512·4·4→classes).
//   nin           Network in Network (Lin et al., 2014) as in micronet's CIFAR-10 table. [1,3,32,32].
//                 0.97 M params, 222.5 M MACs. Units model.<i>.conv (with bias) + model.<i>.bn + ReLU:
//                 i = 0,1,2: 5×5 192, 1×1 160, 1×1 96; max pool 3/2 pad 1; i = 4,5,6: 5×5 192, 1×1 192,
//                 1×1 192; max pool 3/2 pad 1; i = 8,9,10: 3×3 192, 1×1 192, 1×1 classes; global average
//                 pool; flatten (the logits pass through the last BN and ReLU, as in micronet).
//   nin_gc        NIN with grouped convolutions and channel shuffles, micronet's nin_gc (the model
//                 its group-convolution pruning uses). [1,3,32,32]. 591,390 params, 157.7 M MACs.
//                 Units model.<i>: [channel_shuffle model.<i>.shuffle] conv (with bias, groups) + BN +
//                 ReLU; (i: out, kernel, groups, shuffle groups): 0: 256 5×5 1; 1: 256 1×1 2; 2: 256
//                 1×1 2, shuffle 2; 3: max pool 2/2; 4: 512 3×3 16, shuffle 2; 5: 512 1×1 4, shuffle 16;
//                 6: 512 1×1 4, shuffle 4; 7: max pool 2/2; 8: 1024 3×3 32, shuffle 4; 9: 1024 1×1 8,
//                 shuffle 32; 10: classes 1×1; global average pool (micronet's AvgPool2d(8) at 32×32);
//                 flatten.
//   resnet20/32/56  He et al., 2016, CIFAR ResNet-(6n+2), n = 3/5/9. [1,3,32,32]. ResNet-20: 272,474
//                 params, 40.81 M MACs. conv1(3×3 16, no bias)-bn1-relu; layer1..3 of n basic blocks
//                 (16, 32, 64 channels; stride 2 in the first block of layer2 and layer3); block:
//                 conv1(3×3)-bn1-relu-conv2(3×3)-bn2, plus shortcut, then relu; shortcut option B: a
//                 projection layer<k>.0.shortcut.0 (1×1 conv, stride 2, no bias) + shortcut.1 (BN) where
//                 the shape changes, identity elsewhere; global average pool; linear(64→classes).
//                 (Option A, zero-padding shortcuts, gives the paper's 0.27 M / 40.55 M; option B adds
//                 2,752 params and 262,144 MACs.)
//   mobilenet_v2  Sandler et al., 2018, CIFAR variant. [1,3,32,32]. 2.24 M params, 88.0 M MACs.
//                 conv1(3×3 32, stride 1 instead of ImageNet's 2)-bn1-relu6; the paper's (t, c, n, s)
//                 table (1,16,1,1) (6,24,2,1*) (6,32,3,2) (6,64,4,2) (6,96,3,1) (6,160,3,2) (6,320,1,1)
//                 with * = stride 1 instead of 2, so the map goes 32→32→32→16→8→8→4→4; blocks
//                 layers.<i>: conv1(1×1 expand, absent when t = 1)-bn1-relu6, conv2(3×3 depthwise,
//                 stride s)-bn2-relu6, conv3(1×1 project)-bn3, residual add when s = 1 and in = out;
//                 conv2(1×1 320→1280)-bn2-relu6; global average pool; linear(1280→classes); no
//                 dropout; no conv has a bias.
//   repvgg_a0     Ding et al., 2021, RepVGG-A0 in its training-time multi-branch form. [1,3,32,32].
//                 7.84 M params, 123.4 M MACs. Widths 48, 48, 96, 192, 1280; depths 1, 2, 4, 14, 1.
//                 Block: relu(rbr_dense (3×3 conv pad 1 + BN) + rbr_1x1 (1×1 conv + BN) + rbr_identity
//                 (BN, only when in = out and stride 1)); convs have no bias; names as in the authors'
//                 code (stage0.rbr_dense.conv, stage1.0.rbr_1x1.bn, ...). CIFAR adaptation: stage0 has
//                 stride 1 (ImageNet: 2); stages 1–4 start with stride 2, so 32→32→16→8→4→2; global
//                 average pool; linear(1280→classes).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/weight_init.h"

namespace whittle {

/// Options of build_model.
struct ZooOptions {
  /// Classifier outputs (≥ 1). Default 10.
  int64_t num_classes = 10;
  /// Input channels (≥ 1). Default: input_shape[1] when input_shape is given, otherwise 1 for
  /// lenet5 and 3 for the other models. When both are given they must agree.
  std::optional<int64_t> in_channels;
  /// Example input shape [N, C, H, W] declared on the graph (shape inference, MACs). Empty: the
  /// model's default, [1, C, 28, 28] for lenet5 and [1, C, 32, 32] for the others. Layers whose
  /// size depends on H and W (lenet5's fc1, vgg_small's fc) follow it.
  Shape input_shape;
  /// Initialization seed. Unset (default): LibTorch's global CPU generator, as torch.nn does; set:
  /// a private generator seeded with it, so the weights depend on the seed alone.
  std::optional<uint64_t> seed;
  /// How the conv weights are drawn (WeightInit). Default: torch.nn's.
  WeightInit weight_init = WeightInit::kTorch;
};

/// Builds zoo model `name` (one of zoo_models(); see the list at the top of this header) with fresh
/// weights. Throws whittle::Error of kind kUsage for an unknown name (listing the known models),
/// for num_classes/in_channels < 1, and for an input_shape that is not 4-D with positive sizes or
/// disagrees with in_channels; of kind kRuntime (naming the node) for an input too small for the
/// network.
Graph build_model(const std::string& name, const ZooOptions& options = {});

/// Names of the zoo models, in the order of the list above.
std::vector<std::string> zoo_models();

}  // namespace whittle
