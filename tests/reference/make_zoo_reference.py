"""Writes the PyTorch references of whittle's model zoo for tests/zoo_test.cpp.

Usage: make_zoo_reference.py OUT_DIR

For every model in zoo_models.MODELS it writes
  OUT_DIR/<name>.pt    torch.jit.trace of the model in eval mode, with random weights and
                       randomized BatchNorm affine parameters and running statistics;
  OUT_DIR/<name>.json  {"name", "input_shape", "num_classes", "output_shape", "params", "macs"} at the
                       model's default input shape (batch 1). params = sum of p.numel() over
                       parameters; macs counts convolutions (N*Cout*Hout*Wout*(Cin/groups)*kh*kw)
                       and linear layers (rows*in*out) only, measured with forward hooks.
Files are written to a temporary name and renamed, so a failed run leaves nothing half-written.
It also checks that the nin and nin_gc twins equal micronet's own models (check_micronet_twins).
"""

import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo_models import MODELS  # noqa: E402


def randomize(model, gen):
    """Makes every tensor non-trivial: BN gamma in [0.5, 1.5], beta ~ N(0, 0.2), running mean
    ~ N(0, 0.2), running var in [0.5, 2], num_batches_tracked a small count; conv and linear
    weights keep their torch.nn default (Kaiming-uniform) draw, biases are redrawn ~ N(0, 0.1)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.2)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) * 1.5 + 0.5)
                m.num_batches_tracked.fill_(int(torch.randint(1, 1000, (1,), generator=gen)))
            elif isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)


def count_macs(model, input_shape):
    """MACs of one forward pass at input_shape: conv and linear layers only."""
    total = [0]

    def conv_hook(m, inputs, output):
        kh, kw = m.kernel_size
        total[0] += output.numel() * (m.in_channels // m.groups) * kh * kw

    def linear_hook(m, inputs, output):
        rows = inputs[0].numel() // m.in_features
        total[0] += rows * m.in_features * m.out_features

    handles = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
    with torch.no_grad():
        out = model(torch.zeros(input_shape))
    for h in handles:
        h.remove()
    return total[0], list(out.shape)


def check_micronet_twins(gen):
    """nin and nin_gc are micronet's models: micronet's own Net (PyPI micronet, models.nin and
    models.nin_gc) has the same state_dict keys and shapes, and with its weights loaded the twin
    gives the same eval outputs (to float32 round-off, 1e-5 of the largest logit). Exits non-zero
    otherwise."""
    from micronet.models import nin as micronet_nin, nin_gc as micronet_nin_gc

    for name, peer in (("nin", micronet_nin.Net()), ("nin_gc", micronet_nin_gc.Net())):
        ours = MODELS[name][0]()
        randomize(peer, gen)
        theirs = {k: tuple(v.shape) for k, v in peer.state_dict().items()}
        mine = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
        if theirs != mine:
            sys.exit(f"{name}: state_dict differs from micronet's: {sorted(set(theirs.items()) ^ set(mine.items()))[:6]}")
        ours.load_state_dict(peer.state_dict())
        ours.eval()
        peer.eval()
        x = torch.randn(2, 3, 32, 32, generator=gen)
        with torch.no_grad():
            a, b = ours(x), peer(x)
        diff = (a - b).abs().max().item()
        if diff > 1e-5 * b.abs().max().item():
            sys.exit(f"{name}: outputs differ from micronet's Net by {diff}")
        print(f"{name}: equals micronet's Net (max |diff| {diff:.1e})")


def write_atomic(path, write):
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_zoo_reference.py OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    for name, (make, input_shape) in MODELS.items():
        model = make()
        randomize(model, gen)
        model.eval()
        macs, out_shape = count_macs(model, input_shape)
        params = sum(p.numel() for p in model.parameters())
        example = torch.randn((2,) + tuple(input_shape[1:]), generator=gen)
        with torch.no_grad():
            traced = torch.jit.trace(model, example)
        write_atomic(os.path.join(out_dir, name + ".pt"), lambda p: traced.save(p))
        info = {
            "name": name,
            "input_shape": list(input_shape),
            "num_classes": out_shape[-1],
            "output_shape": out_shape,
            "params": params,
            "macs": macs,
        }

        def dump(p, info=info):
            with open(p, "w") as f:
                json.dump(info, f, indent=2)
                f.write("\n")

        write_atomic(os.path.join(out_dir, name + ".json"), dump)
        print(f"{name}: params {params:,}  MACs {macs:,}  output {out_shape}")
    check_micronet_twins(gen)


if __name__ == "__main__":
    main()
