"""Training speed, whittle against a plain PyTorch loop, side by side.

Workloads, CPU, 2 intra-op threads, same model, optimizer, batch size and augmentation:
  lenet5    one epoch of LeNet-5 on the 8,000 bundled MNIST digits, batch 64
  resnet20  200 steps of ResNet-20 on CIFAR-10 (the packed HDF5 of the JPEG archive), batch 128
and quantization-aware training against micronet 1.12.0's own quantizer modules (its `prepare`
on the PyTorch model of tests/reference/zoo_models.py, as bench/micronet_cifar.py does):
  resnet20_w4a4  200 steps, DoReFa W4A4 (recipes/cifar10/resnet20_dorefa_w4a4.yaml)
  resnet20_bnn   200 steps, BNN (resnet20_bnn.yaml; micronet's binary mode, A=2 W=2)
  nin_w2a2       60 steps of NIN, DoReFa W2A2 (nin_dorefa_w2a2.yaml), with NIN FP32 (nin.yaml)
whittle is timed by its own report (training time only, evaluation excluded; one loader worker
thread, since the 2 cores are busy with the training threads); the PyTorch loop times the same
steps. The runs alternate, --repeat times each, and the best time of each side counts. Prints
seconds per step for both and the ratio whittle / PyTorch (≤ 1.0: whittle is at least as fast);
for the QAT workloads also each side's QAT/FP32 ratio (against the same model's FP32 workload).

usage: .venv/bin/python bench/train_compare.py [--build build] [--only WORKLOAD[,WORKLOAD...]] [--repeat N]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import h5py
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import zoo_models  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "bench"))
import micronet_cifar  # noqa: E402
from mnist_idx import load_idx  # noqa: E402

THREADS = 2


def whittle_run(build, recipe, sets):
    out = tempfile.mkdtemp(prefix="whittle-bench-")
    cmd = [os.path.join(ROOT, build, "whittle"), "run", recipe, "--out", out] + sum((["--set", s] for s in sets), [])
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rep = json.load(open(os.path.join(out, "report.json")))
    return rep


def torch_loop(model, images, labels, batch, steps, lr, mean, std, crop_pad, flip, nesterov, wd):
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=nesterov, weight_decay=wd)
    mean_t = torch.tensor(mean).view(1, -1, 1, 1)
    std_t = torch.tensor(std).view(1, -1, 1, 1)
    n = images.shape[0]
    perm = torch.randperm(n)
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        idx = perm[(step * batch) % (n - batch + 1):][:batch]
        x = images[idx]
        if crop_pad:
            x = F.pad(x, (crop_pad,) * 4)
            h, w = images.shape[2], images.shape[3]
            out = torch.empty(batch, x.shape[1], h, w, dtype=x.dtype)
            offs = torch.randint(0, 2 * crop_pad + 1, (batch, 2))
            for i in range(batch):
                t, l = offs[i].tolist()
                out[i] = x[i, :, t:t + h, l:l + w]
            x = out
        if flip:
            m = torch.rand(batch) < 0.5
            x[m] = x[m].flip(3)
        x = (x.float() / 255 - mean_t) / std_t
        y = labels[idx]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--only", help="comma-separated workloads: lenet5, resnet20, resnet20_w4a4, resnet20_bnn, "
                    "nin_fp32, nin_w2a2 (default: all)")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    only = set(args.only.split(",")) if args.only else None
    wanted = lambda w: only is None or w in only  # noqa: E731
    rows = []

    if wanted("lenet5"):
        imgs = torch.from_numpy(load_idx(os.path.join(ROOT, "data/mnist10k/train-images-idx3-ubyte.gz")).copy())
        labs = torch.from_numpy(load_idx(os.path.join(ROOT, "data/mnist10k/train-labels-idx1-ubyte.gz")).copy())
        steps = imgs.shape[0] // 64
        for _ in range(args.repeat):
            rep = whittle_run(args.build, "recipes/mnist/lenet5.yaml",
                              ["training.epochs=1", "training.threads=2", "data.test_limit=1000", "data.num_workers=1"])
            w = 64 / rep["train_images_per_second"]
            model = zoo_models.MODELS["lenet5"][0]()
            p = torch_loop(model, imgs, labs, 64, steps, 0.05, [0.1307], [0.3081], 0, False, True, 5e-4)
            rows.append(("LeNet-5, 1 epoch MNIST, batch 64", w, p))

    cifar = [w for w in ("resnet20", "resnet20_w4a4", "resnet20_bnn", "nin_fp32", "nin_w2a2") if wanted(w)]
    if cifar:
        packed = os.path.join(ROOT, "data/cache/cifar10-jpeg-train.h5")
        if not os.path.exists(packed):
            whittle_run(args.build, "recipes/cifar10/resnet20.yaml",
                        ["training.epochs=1", "data.train_limit=128", "data.test_limit=500"])
        with h5py.File(packed, "r") as f:
            imgs = torch.from_numpy(f["images"][()])
            labs = torch.from_numpy(f["labels"][()])
        mean, std = [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]
        # workload: (label, recipe, zoo model, micronet method or None, steps, weight decay)
        specs = {
            "resnet20": ("ResNet-20 FP32, 200 steps CIFAR-10, batch 128", "resnet20.yaml", "resnet20", None, 200, 5e-4),
            "resnet20_w4a4": ("ResNet-20 DoReFa W4A4, 200 steps", "resnet20_dorefa_w4a4.yaml", "resnet20", "dorefa_w4a4",
                              200, 5e-4),
            "resnet20_bnn": ("ResNet-20 BNN, 200 steps", "resnet20_bnn.yaml", "resnet20", "bnn", 200, 0.0),
            "nin_fp32": ("NIN FP32, 60 steps", "nin.yaml", "nin", None, 60, 5e-4),
            "nin_w2a2": ("NIN DoReFa W2A2, 60 steps", "nin_dorefa_w2a2.yaml", "nin", "dorefa_w2a2", 60, 5e-4),
        }
        for _ in range(args.repeat):
            for w in cifar:
                label, recipe, zoo, method, steps, wd = specs[w]
                rep = whittle_run(args.build, os.path.join("recipes", "cifar10", recipe),
                                  ["training.epochs=1", "training.threads=2", f"data.train_limit={steps * 128}",
                                   "data.test_limit=500", "data.num_workers=1"])
                ws = 128 / rep["train_images_per_second"]
                torch.manual_seed(0)
                model = zoo_models.MODELS[zoo][0]()
                if method:
                    model = micronet_cifar.prepare(model, method)
                p = torch_loop(model, imgs, labs, 128, steps, 0.1, mean, std, 4, True, True, wd)
                rows.append((label, ws, p))

    best = {}
    for name, w, p in rows:
        bw, bp = best.get(name, (float("inf"), float("inf")))
        best[name] = (min(bw, w), min(bp, p))
    print(f"{'workload':46s} {'whittle s/step':>15s} {'PyTorch s/step':>15s} {'ratio':>7s}")
    for name, (w, p) in best.items():
        print(f"{name:46s} {w:15.4f} {p:15.4f} {w / p:7.3f}")
    fp32_of = {"ResNet-20": "ResNet-20 FP32, 200 steps CIFAR-10, batch 128", "NIN": "NIN FP32, 60 steps"}
    qat = [(n, v) for n, v in best.items() if "FP32" not in n and n.split(" ")[0] in fp32_of]
    if qat:
        print(f"\n{'QAT workload':46s} {'whittle QAT/FP32':>17s} {'micronet QAT/FP32':>18s}")
        for name, (w, p) in qat:
            base = best.get(fp32_of[name.split(" ")[0]])
            if base:
                print(f"{name:46s} {w / base[0]:17.3f} {p / base[1]:18.3f}")
    print(f"(CPU, {THREADS} threads, torch {torch.__version__})")


if __name__ == "__main__":
    main()
