"""PyTorch references of whittle's model zoo (graph/zoo.h).

Each class is the torch.nn form of the C++ builder with the same name: same layers, same order,
same state_dict keys, so a checkpoint of one loads into the other by name. The architectural
choices (where BN sits, which convolutions carry a bias, the CIFAR stride adaptations) are
documented in graph/zoo.h and repeated briefly here.
"""

import torch
from torch import nn
import torch.nn.functional as F


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al., 1998) for 28x28 MNIST, with BatchNorm after every layer but the last.

    conv1(in->6, 5x5, pad 2) - bn1 - relu - maxpool 2
    conv2(6->16, 5x5)        - bn2 - relu - maxpool 2
    flatten - fc1(400->120) - bn3 - relu - fc2(120->84) - bn4 - relu - fc3(84->num_classes)
    Layers followed by BN have no bias. (BN in front of every quantized or binarized layer's
    activation keeps its input in the quantizer's range, as BNN and XNOR-Net require.)
    """

    def __init__(self, num_classes=10, in_channels=1, input_hw=(28, 28)):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=2, bias=False)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 16, 5, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        h = ((input_hw[0] // 2) - 4) // 2
        w = ((input_hw[1] // 2) - 4) // 2
        self.fc1 = nn.Linear(16 * h * w, 120, bias=False)
        self.bn3 = nn.BatchNorm1d(120)
        self.fc2 = nn.Linear(120, 84, bias=False)
        self.bn4 = nn.BatchNorm1d(84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.bn3(self.fc1(x)))
        x = F.relu(self.bn4(self.fc2(x)))
        return self.fc3(x)


class VGGSmall(nn.Module):
    """VGG-Small for CIFAR-10 as in the BNN / LQ-Nets literature (Zhang et al., 2018):
    128C3-128C3-MP2-256C3-256C3-MP2-512C3-512C3-MP2-FC.

    Each 3x3 convolution (pad 1, no bias) is followed by BN and ReLU; the 2x2 max pool comes after
    the ReLU of the second convolution of each pair. fc: 512*4*4 -> num_classes, with bias.
    """

    widths = (128, 128, 256, 256, 512, 512)

    def __init__(self, num_classes=10, in_channels=3, input_hw=(32, 32)):
        super().__init__()
        c = in_channels
        for i, w in enumerate(self.widths):
            setattr(self, f"conv{i}", nn.Conv2d(c, w, 3, padding=1, bias=False))
            setattr(self, f"bn{i}", nn.BatchNorm2d(w))
            c = w
        self.fc = nn.Linear(c * (input_hw[0] // 8) * (input_hw[1] // 8), num_classes)

    def forward(self, x):
        for i in range(len(self.widths)):
            x = F.relu(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
            if i % 2 == 1:
                x = F.max_pool2d(x, 2)
        return self.fc(torch.flatten(x, 1))


class ConvBNReLU(nn.Module):
    """conv (with bias) - BN - ReLU, the unit of micronet's Network-in-Network."""

    def __init__(self, cin, cout, kernel, padding):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, padding=padding, bias=True)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class NIN(nn.Module):
    """Network in Network (Lin et al., 2014) for CIFAR-10 in the form of micronet's table:
    three mlpconv blocks 192-160-96 (5x5, 1x1, 1x1), 192-192-192 (5x5, 1x1, 1x1),
    192-192-num_classes (3x3, 1x1, 1x1); every conv has a bias and is followed by BN and ReLU;
    max pool 3/2 pad 1 after the first two blocks; global average pool; flatten.
    State-dict keys: model.<i>.conv / model.<i>.bn with the nn.Sequential indices 0-2, 4-6, 8-10
    (3 and 7 are the max pools, 11 the global average pool).
    """

    def __init__(self, num_classes=10, in_channels=3):
        super().__init__()
        self.model = nn.Sequential(
            ConvBNReLU(in_channels, 192, 5, 2),
            ConvBNReLU(192, 160, 1, 0),
            ConvBNReLU(160, 96, 1, 0),
            nn.MaxPool2d(3, stride=2, padding=1),
            ConvBNReLU(96, 192, 5, 2),
            ConvBNReLU(192, 192, 1, 0),
            ConvBNReLU(192, 192, 1, 0),
            nn.MaxPool2d(3, stride=2, padding=1),
            ConvBNReLU(192, 192, 3, 1),
            ConvBNReLU(192, 192, 1, 0),
            ConvBNReLU(192, num_classes, 1, 0),
            nn.AdaptiveAvgPool2d(1),
        )

    def forward(self, x):
        return torch.flatten(self.model(x), 1)


class ShuffleConvBNReLU(nn.Module):
    """[channel shuffle with `shuffle` groups, when shuffle > 0] -> conv (with bias, `groups`)
    -> BN -> ReLU; the shuffle views [N, C, H, W] as [N, shuffle, C/shuffle, H, W], swaps dims 1
    and 2 and views back (ShuffleNet, Zhang et al., 2018)."""

    def __init__(self, cin, cout, kernel, padding, groups, shuffle):
        super().__init__()
        self.shuffle = shuffle
        self.conv = nn.Conv2d(cin, cout, kernel, padding=padding, groups=groups)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        if self.shuffle:
            n, c, h, w = x.shape
            x = x.view(n, self.shuffle, c // self.shuffle, h, w).transpose(1, 2).reshape(n, c, h, w)
        return F.relu(self.bn(self.conv(x)))


class NINGC(nn.Module):
    """NIN with grouped convolutions and channel shuffles, the layout of micronet's nin_gc:
    (index: out, kernel, groups, shuffle groups before the conv)
    0: 256 5x5 g1; 1: 256 1x1 g2; 2: 256 1x1 g2 shuffle 2; 3: max pool 2/2;
    4: 512 3x3 g16 shuffle 2; 5: 512 1x1 g4 shuffle 16; 6: 512 1x1 g4 shuffle 4; 7: max pool 2/2;
    8: 1024 3x3 g32 shuffle 4; 9: 1024 1x1 g8 shuffle 32; 10: num_classes 1x1; 11: global
    average pool (micronet's AvgPool2d(8) at 32x32); flatten. Convs have a bias; every conv is
    followed by BN and ReLU. State-dict keys model.<i>.conv / model.<i>.bn as in micronet.
    """

    def __init__(self, num_classes=10, in_channels=3):
        super().__init__()
        u = ShuffleConvBNReLU
        self.model = nn.Sequential(
            u(in_channels, 256, 5, 2, 1, 0),
            u(256, 256, 1, 0, 2, 0),
            u(256, 256, 1, 0, 2, 2),
            nn.MaxPool2d(2, stride=2),
            u(256, 512, 3, 1, 16, 2),
            u(512, 512, 1, 0, 4, 16),
            u(512, 512, 1, 0, 4, 4),
            nn.MaxPool2d(2, stride=2),
            u(512, 1024, 3, 1, 32, 4),
            u(1024, 1024, 1, 0, 8, 32),
            u(1024, num_classes, 1, 0, 1, 0),
            nn.AdaptiveAvgPool2d(1),
        )

    def forward(self, x):
        return torch.flatten(self.model(x), 1)


class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-BN-ReLU-conv3x3-BN, plus the shortcut, then ReLU.
    Option B shortcut (He et al., 2016): 1x1 conv (stride s, no bias) + BN when the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for CIFAR-10 (He et al., 2016, section 4.2): conv3x3 16 - BN - ReLU, three stages
    of n basic blocks with 16, 32, 64 channels (stride 2 at the start of stages 2 and 3), global
    average pool, linear(64 -> num_classes). `block(cin, cout, stride)` makes each basic block
    (BasicBlock by default; the peer scripts of bench/ pass their own with the same keys). The stem's
    ReLU is an nn.ReLU module (no parameters), so tools that swap ReLU modules see it."""

    def __init__(self, n, num_classes=10, in_channels=3, block=None):
        super().__init__()
        block = block or BasicBlock
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        c = 16
        for i, (w, s) in enumerate([(16, 1), (32, 2), (64, 2)]):
            blocks = []
            for b in range(n):
                blocks.append(block(c, w, s if b == 0 else 1))
                c = w
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.linear = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.linear(x)


class InvertedResidual(nn.Module):
    """MobileNetV2 block (Sandler et al., 2018): 1x1 expand (omitted when t = 1) - BN - ReLU6,
    3x3 depthwise (stride s) - BN - ReLU6, 1x1 linear projection - BN; residual add when s = 1 and
    in == out. No convolution has a bias."""

    def __init__(self, cin, cout, stride, t):
        super().__init__()
        hidden = cin * t
        self.expand = t != 1
        if self.expand:
            self.conv1 = nn.Conv2d(cin, hidden, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(hidden)
        self.conv2 = nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.conv3 = nn.Conv2d(hidden, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        out = F.relu6(self.bn1(self.conv1(x))) if self.expand else x
        out = F.relu6(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return out + x if self.residual else out


class MobileNetV2(nn.Module):
    """MobileNetV2 for 32x32 CIFAR inputs. Stem conv3x3 32 with stride 1 (ImageNet: 2); the
    (t, c, n, s) table of the paper with the second row's stride 2 -> 1, so the feature map goes
    32 -> 32 -> 32 -> 16 -> 8 -> 8 -> 4 -> 4; conv1x1 320 -> 1280 - BN - ReLU6; global average pool;
    linear(1280 -> num_classes). No dropout. Keys: conv1/bn1, layers.<i>.*, conv2/bn2, linear."""

    table = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes=10, in_channels=3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        blocks, c = [], 32
        for t, w, n, s in self.table:
            for i in range(n):
                blocks.append(InvertedResidual(c, w, s if i == 0 else 1, t))
                c = w
        self.layers = nn.Sequential(*blocks)
        self.conv2 = nn.Conv2d(c, 1280, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(1280)
        self.linear = nn.Linear(1280, num_classes)

    def forward(self, x):
        x = F.relu6(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = F.relu6(self.bn2(self.conv2(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.linear(x)


class ConvBN(nn.Module):
    """conv (no bias) - BN, a RepVGG branch."""

    def __init__(self, cin, cout, kernel, stride, padding):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


class RepVGGBlock(nn.Module):
    """Training-time RepVGG block (Ding et al., 2021): ReLU(BN(conv3x3 x) + BN(conv1x1 x) + BN(x)),
    the identity BN only when in == out and stride 1. Keys rbr_dense, rbr_1x1, rbr_identity as in
    the authors' code."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.rbr_identity = nn.BatchNorm2d(cin) if cin == cout and stride == 1 else None
        self.rbr_dense = ConvBN(cin, cout, 3, stride, 1)
        self.rbr_1x1 = ConvBN(cin, cout, 1, stride, 0)

    def forward(self, x):
        out = self.rbr_dense(x) + self.rbr_1x1(x)
        if self.rbr_identity is not None:
            out = out + self.rbr_identity(x)
        return F.relu(out)


class RepVGGA0(nn.Module):
    """RepVGG-A0 (a = 0.75, b = 2.5; widths 48, 48, 96, 192, 1280; depths 1, 2, 4, 14, 1) for CIFAR:
    stage0 has stride 1 instead of 2, stages 1-4 keep stride 2 (32 -> 32 -> 16 -> 8 -> 4 -> 2);
    global average pool; linear(1280 -> num_classes). stage0 is a single block (keys stage0.*), the
    other stages are sequences (stage<k>.<i>.*), as in the authors' code."""

    widths = (48, 48, 96, 192, 1280)
    depths = (1, 2, 4, 14, 1)
    strides = (1, 2, 2, 2, 2)

    def __init__(self, num_classes=10, in_channels=3):
        super().__init__()
        self.stage0 = RepVGGBlock(in_channels, self.widths[0], self.strides[0])
        c = self.widths[0]
        for k in range(1, 5):
            blocks = []
            for i in range(self.depths[k]):
                blocks.append(RepVGGBlock(c, self.widths[k], self.strides[k] if i == 0 else 1))
                c = self.widths[k]
            setattr(self, f"stage{k}", nn.Sequential(*blocks))
        self.linear = nn.Linear(c, num_classes)

    def forward(self, x):
        x = self.stage0(x)
        x = self.stage4(self.stage3(self.stage2(self.stage1(x))))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.linear(x)


# name -> (constructor, default input shape with batch 1)
MODELS = {
    "lenet5": (lambda: LeNet5(), (1, 1, 28, 28)),
    "vgg_small": (lambda: VGGSmall(), (1, 3, 32, 32)),
    "nin": (lambda: NIN(), (1, 3, 32, 32)),
    "nin_gc": (lambda: NINGC(), (1, 3, 32, 32)),
    "resnet20": (lambda: CifarResNet(3), (1, 3, 32, 32)),
    "resnet32": (lambda: CifarResNet(5), (1, 3, 32, 32)),
    "resnet56": (lambda: CifarResNet(9), (1, 3, 32, 32)),
    "mobilenet_v2": (lambda: MobileNetV2(), (1, 3, 32, 32)),
    "repvgg_a0": (lambda: RepVGGA0(), (1, 3, 32, 32)),
}
