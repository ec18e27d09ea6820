"""Writes PyTorch's values of the distillation losses for tests/distill_test.cpp.

Usage: make_distill_reference.py OUT_DIR

OUT_DIR/distill_reference.pt is a scripted holder whose buffers are, for each batch size N in
(1, 7) and class count K in (10, 100), with T = 4:
  kd_N_K_s, kd_N_K_t      student and teacher logits [N, K] ~ N(0, 3)
  kd_N_K_loss             T² · F.kl_div(log_softmax(s/T), softmax(t/T), reduction="batchmean")
  kd_N_K_grad             its gradient with respect to s
and for the features (N in (1, 7); student [N, 3, 5, 6], teacher [N, 8, 5, 6]):
  at_N_s, at_N_t          features ~ N(0, 1)
  at_N_loss               beta/2 · ||F.normalize(sum_c s², dim 1) − F.normalize(sum_c t², dim 1)||₂,
                          batch mean, beta = 2
  hint_N_s, hint_N_t      [N, 8, 5, 6] each
  hint_N_loss             F.mse_loss(s, t)
The file is written to a temporary name and renamed.
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn


class Holder(nn.Module):
    def __init__(self, tensors):
        super().__init__()
        for k, v in tensors.items():
            self.register_buffer(k, v)

    def forward(self):
        return 0


def attention(x):
    return F.normalize(x.pow(2).sum(1).flatten(1), dim=1)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_distill_reference.py OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(14)
    t = {}
    T = 4.0
    for n in (1, 7):
        for k in (10, 100):
            s = (torch.randn(n, k, generator=gen) * 3).requires_grad_(True)
            te = torch.randn(n, k, generator=gen) * 3
            loss = F.kl_div(F.log_softmax(s / T, 1), F.softmax(te / T, 1), reduction="batchmean") * T * T
            loss.backward()
            p = f"kd_{n}_{k}_"
            t[p + "s"], t[p + "t"], t[p + "loss"], t[p + "grad"] = s.detach(), te, loss.detach(), s.grad
        s = torch.randn(n, 3, 5, 6, generator=gen)
        te = torch.randn(n, 8, 5, 6, generator=gen)
        t[f"at_{n}_s"], t[f"at_{n}_t"] = s, te
        t[f"at_{n}_loss"] = (2.0 / 2 * (attention(s) - attention(te)).norm(dim=1).mean()).detach()
        hs = torch.randn(n, 8, 5, 6, generator=gen)
        ht = torch.randn(n, 8, 5, 6, generator=gen)
        t[f"hint_{n}_s"], t[f"hint_{n}_t"], t[f"hint_{n}_loss"] = hs, ht, F.mse_loss(hs, ht)
    path = os.path.join(out_dir, "distill_reference.pt")
    torch.jit.script(Holder(t)).save(path + ".tmp")
    os.replace(path + ".tmp", path)
    print(f"wrote {path}: {len(t)} tensors")


if __name__ == "__main__":
    main()
