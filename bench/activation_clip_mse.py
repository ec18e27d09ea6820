#!/usr/bin/env python3
"""Clip levels for DoReFa k-bit activations from an FP32 model's activation statistics.

For each ReLU output of the CPU-budget FP32 ResNet-20 (docs/results.md), on training images
without augmentation, prints the mean squared error of DoReFa's k-bit activation quantizer
c·round(clip(a, 0, c)/c·(2^k − 1))/(2^k − 1) over a grid of clip levels c, the level with the least
error per layer, and the total error of uniform and two-group choices (the ReLUs inside the
residual blocks, `relu1`, against the others). The model's last ReLU feeds the full-precision
classifier and is left out of the totals. This is how recipes/cifar10/resnet20_budget_dorefa_w2a2.yaml
chose its two clip levels (docs/quantization.md, "Clip levels per layer").

usage: .venv/bin/python bench/activation_clip_mse.py [--bits 2] [--images 500] [--build build]
       [--fp32 runs/cifar10/resnet20_budget]
"""
import argparse
import os
import sys
import tempfile

import torch
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import micronet_cifar as mc  # noqa: E402  (the FP32 loader and the packed-data reader)


def quantize(v, clip, levels):
    return torch.round(v.clamp(0, clip) / clip * levels) / levels * clip


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", type=int, default=2)
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--build", default="build")
    p.add_argument("--fp32", default=os.path.join("runs", "cifar10", "resnet20_budget"))
    p.add_argument("--recipe", default=os.path.join("recipes", "cifar10", "resnet20_budget_dorefa_w2a2.yaml"))
    args = p.parse_args()
    os.chdir(mc.ROOT)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = mc.load_fp32(args.build, args.fp32, tmp).eval()
    recipe = yaml.safe_load(open(args.recipe))
    images, _ = mc.load_split(recipe, "train")
    d = recipe["data"]
    mean = torch.tensor(d["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(d["std"]).view(1, 3, 1, 1)
    x = (images[: args.images].float() / 255 - mean) / std

    acts = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ReLU):
            mod.register_forward_hook(lambda m, i, o, name=name: acts.__setitem__(name, o.detach().flatten()[::7]))
    with torch.no_grad():
        model(x)
    last = list(acts)[-1]
    levels = 2 ** args.bits - 1
    grid = [0.125 * k for k in range(2, 33)]  # 0.25 … 4
    errors = {name: [((quantize(v, c, levels) - v) ** 2).mean().item() for c in grid] for name, v in acts.items()}

    print(f"DoReFa {args.bits}-bit activations, {args.images} training images; MSE per layer at each clip level")
    shown = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0]
    print(f"{'layer':16s} {'p99':>5s} " + " ".join(f"{c:>7.2f}" for c in shown) + "   best")
    for name, e in errors.items():
        best = min(range(len(grid)), key=lambda i: e[i])
        note = "  (feeds the FP32 classifier: not quantized)" if name == last else ""
        print(f"{name:16s} {acts[name].quantile(0.99).item():5.2f} " +
              " ".join(f"{e[grid.index(c)]:7.4f}" for c in shown) + f"   {grid[best]:.3f}{note}")
    layers = [n for n in errors if n != last]
    total = lambda pick: sum(errors[n][grid.index(pick(n))] for n in layers)  # noqa: E731
    print(f"\ntotal MSE over the {len(layers)} quantized activations:")
    print(f"  per-layer best          {sum(min(errors[n]) for n in layers):.4f}")
    for c in (1.0, 1.5, 2.0):
        print(f"  every layer at {c:<4}     {total(lambda n, c=c: c):.4f}")
    for inner, outer in ((0.75, 1.25), (1.0, 1.5)):
        print(f"  relu1 {inner}, others {outer}  {total(lambda n: inner if n.endswith('relu1') else outer):.4f}")


if __name__ == "__main__":
    main()
