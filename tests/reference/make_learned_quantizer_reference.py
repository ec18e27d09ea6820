"""Writes PyTorch's values and gradients of LSQ and PACT for tests/learned_quantizers_test.cpp.

Usage: make_learned_quantizer_reference.py OUT_DIR

The references are the papers' own formulations in PyTorch autograd, written independently of
whittle's hand-written backward passes:
  LSQ (Esser et al., 2020, the paper's pseudo-code): s' = grad_scale(s, g), v = clamp(x/s', −Q_N, Q_P),
      x̂ = round_pass(v)·s', with grad_scale(s, g) = (s − s·g).detach() + s·g and
      round_pass(v) = (round(v) − v).detach() + v.
  PACT (Choi et al., 2018, eq. 1 and 3): y = 0.5·(|x| − |x − α| + α), y_q = y + (round(y·n/α)·α/n − y).detach()
      with n = 2^k − 1, so that ∂y_q/∂α = ∂y/∂α (1 where x > α) and ∂y_q/∂x = 1 on (0, α).
OUT_DIR/learned_quantizer_reference.pt is a scripted holder whose buffers are, for each case:
  <case>_x, <case>_s (or _alpha), <case>_up     the input, the step (or clip) and the upstream gradient
  <case>_g                                       LSQ's gradient scale g (one element)
  <case>_y, <case>_gx, <case>_gs (or _galpha)    the output and the gradients
Cases: lsq_w{2,4,8}_tensor (one step for a [32, 8, 3, 3] weight, g = 1/√(numel·Q_P)),
lsq_w{2,4,8}_channel (a step per output channel along axis 0, g = 1/√(elements per channel·Q_P)),
lsq_a{1,2,4,8} (activations [16, 8, 6, 6] ≥ −0.5 on the unsigned grid, g = 1/√(elements per sample·Q_P)),
pact_a{2,4} (α = 1.5, activations [16, 8, 6, 6]), and LSQ+ (Bhalgat et al., 2020) lsqp_a{2,4}:
s' = grad_scale(s, g), β' = grad_scale(β, g), x̂ = round_pass(clamp((x − β')/s', 0, Q_P))·s' + β' on Swish
outputs [16, 8, 6, 6] with β = −0.25 (extra buffers <case>_beta, <case>_gbeta). Inputs are continuous random values, so that
none lies on a bound or a rounding midpoint, where the formulations' conventions could differ.
The file is written to a temporary name and renamed.
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_distill_reference import Holder  # noqa: E402  (a scripted module of buffers)


def grad_scale(s, g):
    return (s - s * g).detach() + s * g


def round_pass(v):
    return (v.round() - v).detach() + v


def lsq(x, s, q_n, q_p, g):
    s = grad_scale(s, g)
    return round_pass(torch.clamp(x / s, -q_n, q_p)) * s


def lsq_plus(x, s, beta, q_p, g):
    s, beta = grad_scale(s, g), grad_scale(beta, g)
    return round_pass(torch.clamp((x - beta) / s, 0, q_p)) * s + beta


def pact(x, alpha, bits):
    n = 2 ** bits - 1
    y = 0.5 * (x.abs() - (x - alpha).abs() + alpha)
    return y + (torch.round(y * n / alpha) * alpha / n - y).detach()


def case(out, name, x, param, fn, param_key):
    x = x.clone().requires_grad_(True)
    p = param.clone().requires_grad_(True)
    y = fn(x, p)
    up = torch.randn_like(y)
    y.backward(up)
    out[f"{name}_x"] = x.detach()
    out[f"{name}_{param_key}"] = param.detach()
    out[f"{name}_up"] = up
    out[f"{name}_y"] = y.detach()
    out[f"{name}_gx"] = x.grad
    out[f"{name}_g{param_key}"] = p.grad


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    out = {}
    w = torch.randn(32, 8, 3, 3) * 0.1
    for bits in (2, 4, 8):
        q_n, q_p = 2 ** (bits - 1), 2 ** (bits - 1) - 1
        s = 2 * w.abs().mean().reshape(1) / math.sqrt(q_p) * 0.9
        g = 1 / math.sqrt(w.numel() * q_p)
        case(out, f"lsq_w{bits}_tensor", w, s, lambda x, p: lsq(x, p, q_n, q_p, g), "s")
        out[f"lsq_w{bits}_tensor_g"] = torch.tensor([g], dtype=torch.float64)
        s = 2 * w.abs().flatten(1).mean(1) / math.sqrt(q_p) * (0.7 + 0.6 * torch.rand(32))
        g = 1 / math.sqrt(w[0].numel() * q_p)
        case(out, f"lsq_w{bits}_channel", w, s, lambda x, p: lsq(x, p.reshape(-1, 1, 1, 1), q_n, q_p, g), "s")
        out[f"lsq_w{bits}_channel_g"] = torch.tensor([g], dtype=torch.float64)
    a = torch.randn(16, 8, 6, 6).clamp_min(-0.5)
    for bits in (1, 2, 4, 8):
        q_p = 2 ** bits - 1
        s = (2 * a.abs().mean() / math.sqrt(q_p) * 1.1).reshape(1)
        g = 1 / math.sqrt(a[0].numel() * q_p)
        case(out, f"lsq_a{bits}", a, s, lambda x, p: lsq(x, p, 0, q_p, g), "s")
        out[f"lsq_a{bits}_g"] = torch.tensor([g], dtype=torch.float64)
    for bits in (2, 4):
        case(out, f"pact_a{bits}", a, torch.tensor([1.5]), lambda x, p: pact(x, p, bits), "alpha")
    # LSQ+: Swish outputs (≥ −0.28), a learned offset β = −0.25 beside the step.
    z = torch.randn(16, 8, 6, 6) * 2
    swish = z * torch.sigmoid(z)
    for bits in (2, 4):
        q_p = 2 ** bits - 1
        g = 1 / math.sqrt(swish[0].numel() * q_p)
        s = ((swish + 0.25).abs().mean() * 2 / math.sqrt(q_p)).reshape(1)
        beta = torch.tensor([-0.25])
        name = f"lsqp_a{bits}"
        x = swish.clone().requires_grad_(True)
        sp, bp = s.clone().requires_grad_(True), beta.clone().requires_grad_(True)
        y = lsq_plus(x, sp, bp, q_p, g)
        up = torch.randn_like(y)
        y.backward(up)
        out.update({f"{name}_x": swish, f"{name}_s": s, f"{name}_beta": beta, f"{name}_up": up, f"{name}_y": y.detach(),
                    f"{name}_gx": x.grad, f"{name}_gs": sp.grad, f"{name}_gbeta": bp.grad,
                    f"{name}_g": torch.tensor([g], dtype=torch.float64)})
    path = os.path.join(out_dir, "learned_quantizer_reference.pt")
    tmp = path + ".tmp"
    torch.jit.save(torch.jit.script(Holder(out)), tmp)
    os.replace(tmp, path)
    print(f"wrote {len(out)} tensors to {path}")


if __name__ == "__main__":
    main()
