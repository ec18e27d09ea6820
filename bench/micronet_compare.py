"""DoReFa QAT of LeNet-5: whittle's recipes against micronet's own quantizers, same work, side by side.

micronet 1.12.0 (PyPI `micronet`) is the peer: its DoReFa module
(micronet.compression.quantization.wqaq.dorefa.quantize.prepare) swaps every conv and linear layer
but the first for its QuantConv2d / QuantLinear (weights: DoReFa tanh quantizer; inputs: its
activation quantizer, round(clip(0.1·a, 0, 1)·(2^k − 1)) / (2^k − 1)). Both sides train the same
LeNet-5 (tests/reference/zoo_models.py, the zoo's architecture), on the same bundled MNIST digits,
with the schedule of whittle's recipe recipes/mnist/lenet5_dorefa_w<k>a<k>.yaml read from the file
(epochs, batch size, SGD with momentum / Nesterov / weight decay, cosine learning rate set every
batch, normalization), for each seed and intra-op thread count (both sides' float results depend
on the thread count, docs/reproducibility.md); the micronet side in a plain PyTorch loop. Prints
per bit width each side's per-run top-1 on the 2,000 test digits, the means and the difference whittle − micronet. With --check, exits 1 when a whittle mean
is below micronet's.

Each side quantizes as it does by default: micronet's prepare() quantizes the classifier (fc3)
too and rounds half away from zero; whittle keeps the first and last layers in full precision
(DESIGN.md) and rounds half to even. whittle's recipes also set DoReFa's activation clip level
(activation_clip); micronet multiplies activations by 0.1 before its [0, 1] clip, a fixed range of
[0, 10].

usage: .venv/bin/python bench/micronet_compare.py [--bits 8,4,2] [--seeds 0,1,2] [--threads 1,2]
                                                  [--build build] [--out runs/sweep] [--check]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import zoo_models  # noqa: E402
from micronet_cifar import learning_rate, steps_per_epoch  # noqa: E402  (whittle's schedule and batch count)
from mnist_idx import load_split  # noqa: E402
from seed_sweep import run_one  # noqa: E402


def micronet_run(recipe, seed, threads, train, test):
    """Trains LeNet-5 with micronet's DoReFa layers under `recipe`'s schedule; returns test top-1 (%)."""
    from micronet.compression.quantization.wqaq.dorefa import quantize as mq

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    q = next(m for m in recipe["modifiers"] if m["name"] == "quantize")
    assert q["method"] == "dorefa", recipe
    model = mq.prepare(zoo_models.LeNet5(num_classes=10), inplace=True, a_bits=q["activation_bits"],
                       w_bits=q["weight_bits"])
    d, t = recipe["data"], recipe["training"]
    o = t["optimizer"]
    assert o["name"] == "sgd" and t["lr_schedule"]["name"] == "cosine", "only SGD with a cosine schedule is mirrored"
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o.get("momentum", 0.0),
                          nesterov=o.get("nesterov", False), weight_decay=o.get("weight_decay", 0.0))
    mean = torch.tensor(d["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(d["std"]).view(1, -1, 1, 1)

    def prep(x):
        return (torch.from_numpy(x).float() / 255 - mean) / std

    xtr, ytr = prep(train[0]), torch.from_numpy(train[1])
    xte, yte = prep(test[0]), torch.from_numpy(test[1])
    batch, epochs = d["batch_size"], t["epochs"]
    steps = steps_per_epoch(xtr.shape[0], d)
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(xtr.shape[0], generator=gen)
        for i in range(steps):
            e = epoch + i / steps
            for g in opt.param_groups:
                g["lr"] = learning_rate(t["lr_schedule"], o["lr"], e, epochs)
            idx = perm[i * batch:(i + 1) * batch]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum())
                      for i in range(0, xte.shape[0], 1000))
    return 100.0 * correct / xte.shape[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bits", default="8,4,2")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", default="1,2", help="comma-separated intra-op thread counts (default 1,2)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="runs/sweep", help="whittle run directories (shared with scripts/seed_sweep.py)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a whittle mean is below micronet's")
    args = ap.parse_args()
    os.chdir(ROOT)
    seeds = [int(s) for s in args.seeds.split(",")]
    bits = [int(b) for b in args.bits.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    try:
        import micronet  # noqa: F401
    except ImportError:
        sys.exit("micronet_compare.py: micronet is not installed (it is in requirements.txt: scripts/setup.sh)")

    data_root = os.path.join(ROOT, "data", "mnist10k")
    train, test = load_split(data_root, "train"), load_split(data_root, "t10k")
    rows, behind = [], []
    for k in bits:
        path = f"recipes/mnist/lenet5_dorefa_w{k}a{k}.yaml"
        recipe = yaml.safe_load(open(path))
        w, m = [], []
        for t in thread_counts:
            for s in seeds:
                rep = run_one(args.build, path, os.path.join(args.out, f"lenet5_dorefa_w{k}a{k}", f"s{s}_t{t}"), s, t, [])
                w.append(100 * rep["test_top1"])
                t0 = time.perf_counter()
                m.append(micronet_run(recipe, s, t, train, test))
                print(f"W{k}A{k} seed {s}, {t} threads: whittle {w[-1]:.2f} %, micronet {m[-1]:.2f} % "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
        rows.append((k, w, m))
        if statistics.mean(w) < statistics.mean(m):
            behind.append(k)

    print()
    print("| bits | whittle per run | whittle mean | micronet 1.12.0 per run | micronet mean | whittle − micronet |")
    print("|---|---|---:|---|---:|---:|")
    for k, w, m in rows:
        d = statistics.mean(w) - statistics.mean(m)
        print(f"| W{k}A{k} | {' / '.join(f'{v:.2f}' for v in w)} | {statistics.mean(w):.2f} % "
              f"| {' / '.join(f'{v:.2f}' for v in m)} | {statistics.mean(m):.2f} % | {d:+.2f} |")
    print(f"(runs: seeds {args.seeds} × intra-op threads {args.threads}, ATen CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__})")
    if args.check and behind:
        print("whittle's mean is below micronet's at " + ", ".join(f"W{k}A{k}" for k in behind))
        sys.exit(1)


if __name__ == "__main__":
    main()
