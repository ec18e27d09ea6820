#!/usr/bin/env python3
"""Data-parallel scaling on one machine: `whittle run` of a recipe as one process with T threads
against R ranks (torchrun, Gloo) with T/R threads each, on the same images, alternating, and the
ratio of their training images per second (report.json's train_images_per_second: the training
passes only, evaluation excluded; for R ranks all ranks' images over rank 0's training time).

usage: .venv/bin/python bench/distributed_scaling.py [--recipe recipes/cifar10/resnet20.yaml]
           [--steps 40] [--ranks 2] [--threads 2] [--repeats 3] [--build build]

Each run trains one epoch of steps × batch_size × ranks images (data.train_limit): the single
process makes steps × ranks optimizer steps of batch_size images, each rank `steps` steps of
batch_size images (the global batch is ranks × batch_size, as PyTorch DDP). One loader thread a
process. The communication cost is 1 − ratio when the ranks' compute equals the single process's.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, ranks, threads, out):
    bs = args.batch_size
    sets = ["training.epochs=1", f"data.train_limit={args.steps * bs * args.ranks}", "data.test_limit=500",
            "data.num_workers=1", f"data.batch_size={bs}", f"training.threads={threads}"]
    cmd = [os.path.join(args.build, "whittle"), "run", args.recipe, "--out", out]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if ranks > 1:
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = [torchrun, "--no-python", f"--nproc-per-node={ranks}", "--master-port=29731"] + cmd
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\nfailed with exit {r.returncode}:\n{r.stderr[-2000:]}")
    rep = json.load(open(os.path.join(out, "report.json")))
    return rep["train_images_per_second"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="recipes/cifar10/resnet20.yaml")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps of each rank")
    ap.add_argument("--batch-size", type=int, default=128, help="images a batch, in every process")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of the single process (split among the ranks)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    per_rank = max(1, args.threads // args.ranks)
    work = tempfile.mkdtemp(prefix="whittle-scaling-")
    single, multi = [], []
    try:
        for i in range(args.repeats):
            single.append(run(args, 1, args.threads, os.path.join(work, f"single{i}")))
            multi.append(run(args, args.ranks, per_rank, os.path.join(work, f"ranks{i}")))
            print(f"repeat {i + 1}: 1 process × {args.threads} threads {single[-1]:.1f} images/s, "
                  f"{args.ranks} ranks × {per_rank} thread(s) {multi[-1]:.1f} images/s, ratio {multi[-1] / single[-1]:.3f}",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [m / s for m, s in zip(multi, single)]
    print(f"{os.path.basename(args.recipe)}: {args.steps} steps of {args.batch_size} images a rank; "
          f"median 1 process {statistics.median(single):.1f} images/s, {args.ranks} ranks {statistics.median(multi):.1f} "
          f"images/s; ratio median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
