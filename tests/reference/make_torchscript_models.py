"""Writes the TorchScript models that tests/torchscript_import_test.cpp imports.

Usage: make_torchscript_models.py OUT_DIR

For every model below it writes OUT_DIR/<name>.pt: torch.jit.trace (or torch.jit.script where
noted) of the model in eval mode, with torch.manual_seed(0) weights and randomized BatchNorm
affine parameters and running statistics (so that BN is not the identity). For models without
dropout it also writes OUT_DIR/<name>.train.pt, a scripted holder whose forward() returns nothing
useful but whose attributes `x` (a batch-2 input) and `y` (the eager model's train-mode output on
it, batch statistics) give the C++ test a train-mode reference.

  torchvision (input 1x3x224x224, traced): resnet18, mobilenet_v2, vgg11_bn, squeezenet1_0,
      shufflenet_v2_x0_5, densenet121, efficientnet_b0, regnet_y_400mf (grouped convolutions,
      squeeze-excitation), googlenet (without the auxiliary heads), mobilenet_v3_small
  small models the importer does not special-case:
      scripted_residual (torch.jit.script; 1x3x32x32): conv/BN/ReLU, residual add, cat, a loop,
          functional relu and F.interpolate through TorchScript's own code paths
      tiny_unet (traced; 1x3x32x32): max-pool encoder, transposed-conv and bilinear/nearest
          upsampling decoder with skip concatenation, sigmoid output
      chunk_mix (traced; 1x8x16x16): chunk, split with sizes, permute/transpose, softmax, GELU,
          SiLU, LeakyReLU, Hardswish, Hardsigmoid, tanh, elementwise mul, Dropout2d, avg-pool,
          x.view(x.size(0), -1), a hand-written addmm linear and a matmul + bias linear, mean
  error cases:
      unsupported_fft (traced; 1x3x16x16): torch.fft.fft2 inside body.1
      fixed_batch (traced; 1x3x8x8): x.reshape(1, -1), which bakes the batch size in

Files are written to a temporary name and renamed, so a failed run leaves nothing half-written.
"""

import copy
import os
import sys

import torch
import torch.nn.functional as F
import torchvision
from torch import nn


def randomize(model, gen):
    """BN gamma in [0.5, 1.5], beta ~ N(0, 0.2), running mean ~ N(0, 0.2), running var in
    [0.5, 2], num_batches_tracked a small count; biases of conv/linear ~ N(0, 0.1)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.2)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) * 1.5 + 0.5)
                m.num_batches_tracked.fill_(int(torch.randint(1, 1000, (1,), generator=gen)))
            elif isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)) and m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)


class ScriptedResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.side = nn.Conv2d(8, 4, 1)
        self.side2 = nn.Conv2d(8, 4, 1)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, 5)
        self.repeats = 2

    def forward(self, x):
        x = self.stem(x)
        y = self.bn(self.conv(x))
        y = F.relu(y + x)
        for _ in range(self.repeats):
            y = y + x
        z = torch.cat([y, self.side(y), self.side2(x).sigmoid()], 1)
        z = F.interpolate(z, scale_factor=2.0, mode="nearest")
        z = F.max_pool2d(z, 2)
        z = self.pool(z)
        return self.fc(torch.flatten(z, 1))


class TinyUNet(nn.Module):
    def __init__(self):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

        self.enc1 = block(3, 8)
        self.enc2 = block(8, 16)
        self.bottom = block(16, 16)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(16, 16, 2, stride=2)
        self.dec2 = block(32, 8)
        self.dec1 = block(16, 8)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        b = self.bottom(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], dim=1))
        u1 = F.interpolate(d2, size=(e1.shape[2], e1.shape[3]), mode="bilinear", align_corners=False)
        d1 = self.dec1(torch.cat([u1, e1], dim=1))
        d1 = d1 + F.interpolate(F.avg_pool2d(d1, 2), scale_factor=2.0, mode="nearest")
        return torch.sigmoid(self.head(d1))


class AddmmLinear(nn.Module):
    """A linear layer written as addmm(bias, x, weight.t())."""

    def __init__(self, cin, cout):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin) / cin**0.5)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1)

    def forward(self, x):
        return torch.addmm(self.bias, x, self.weight.t())


class MatmulLinear(nn.Module):
    """A linear layer written as x.matmul(weight.t()) + bias."""

    def __init__(self, cin, cout):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin) / cin**0.5)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1)

    def forward(self, x):
        return x.matmul(self.weight.t()) + self.bias


class ChunkMix(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=2), nn.BatchNorm2d(4), nn.GELU())
        self.b = nn.Sequential(nn.Conv2d(4, 4, 1), nn.SiLU(), nn.Dropout2d(0.2))
        self.c = nn.Sequential(nn.Conv2d(8, 12, 1), nn.LeakyReLU(0.2), nn.Hardswish())
        self.d = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, dilation=1, stride=2), nn.Hardsigmoid())
        self.act = nn.Tanh()
        self.fc1 = AddmmLinear(4 * 4 * 4 + 8, 16)
        self.fc2 = MatmulLinear(16, 6)

    def forward(self, x):
        p, q = x.chunk(2, dim=1)
        y = torch.cat([self.a(p), self.b(q)], 1)
        y = self.c(y)
        u, v, w = torch.split(y, [4, 4, 4], dim=1)
        g = torch.softmax(v.permute(0, 2, 3, 1), dim=-1).permute(0, 3, 1, 2)
        h = u * g + self.act(w.transpose(2, 3)).transpose(2, 3)
        h = F.avg_pool2d(self.d(h), 2)
        flat = h.view(h.size(0), -1)
        feats = torch.cat([flat, y.mean([2, 3]).split(8, dim=1)[0]], 1)
        return self.fc2(F.relu(self.fc1(feats)))


class FFTBlock(nn.Module):
    def forward(self, x):
        return torch.fft.fft2(x).real


class UnsupportedFFT(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), FFTBlock(), nn.ReLU())

    def forward(self, x):
        return self.body(x)


class FixedBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(self.conv(x).reshape(1, -1))


class TrainReference(nn.Module):
    def __init__(self, x, y):
        super().__init__()
        self.register_buffer("x", x)
        self.register_buffer("y", y)

    def forward(self):
        return self.y


# name: (constructor, input shape, scripted, has dropout)
MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(), (1, 3, 224, 224), False, False),
    "mobilenet_v2": (lambda: torchvision.models.mobilenet_v2(), (1, 3, 224, 224), False, True),
    "vgg11_bn": (lambda: torchvision.models.vgg11_bn(), (1, 3, 224, 224), False, True),
    "squeezenet1_0": (lambda: torchvision.models.squeezenet1_0(), (1, 3, 224, 224), False, True),
    "shufflenet_v2_x0_5": (lambda: torchvision.models.shufflenet_v2_x0_5(), (1, 3, 224, 224), False, False),
    "densenet121": (lambda: torchvision.models.densenet121(), (1, 3, 224, 224), False, False),
    "scripted_residual": (ScriptedResidual, (1, 3, 32, 32), True, False),
    "tiny_unet": (TinyUNet, (1, 3, 32, 32), False, False),
    "chunk_mix": (ChunkMix, (1, 8, 16, 16), False, True),
    "unsupported_fft": (UnsupportedFFT, (1, 3, 16, 16), False, True),
    "fixed_batch": (FixedBatch, (1, 3, 8, 8), False, True),
    "efficientnet_b0": (lambda: torchvision.models.efficientnet_b0(), (1, 3, 224, 224), False, True),
    "regnet_y_400mf": (lambda: torchvision.models.regnet_y_400mf(), (1, 3, 224, 224), False, False),
    "googlenet": (lambda: torchvision.models.googlenet(aux_logits=False, init_weights=True), (1, 3, 224, 224), False, True),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(), (1, 3, 224, 224), False, True),
}


def save_atomic(module, path):
    tmp = path + ".tmp"
    torch.jit.save(module, tmp)
    os.replace(tmp, path)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_torchscript_models.py OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(2)
    for index, (name, (make, shape, scripted, has_dropout)) in enumerate(MODELS.items()):
        torch.manual_seed(index)
        gen = torch.Generator().manual_seed(1000 + index)
        model = make()
        randomize(model, gen)
        model.eval()
        with torch.no_grad():
            if scripted:
                ts = torch.jit.script(model)
            else:
                ts = torch.jit.trace(model, torch.randn(shape, generator=gen), check_trace=False)
        save_atomic(ts, os.path.join(out_dir, name + ".pt"))
        if not has_dropout:
            x = torch.randn((2,) + tuple(shape[1:]), generator=gen)
            train_model = copy.deepcopy(model).train()
            with torch.no_grad():
                y = train_model(x)
            save_atomic(torch.jit.script(TrainReference(x, y)), os.path.join(out_dir, name + ".train.pt"))
        print(f"wrote {name}")


if __name__ == "__main__":
    main()
