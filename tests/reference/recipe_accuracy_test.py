"""Trains the LeNet-5 recipes that have floors (FLOORS) on the bundled MNIST digits and checks the
test top-1 (2,000 digits) of each against the floor the project promises.

One run's accuracy moves with the seed, the intra-op thread count and the CPU instruction set
(docs/reproducibility.md), by up to a point for the binary networks, so a method whose runs spread
widely (DoReFa W2A2, BNN, XNOR-Net) is checked on the mean of seeds 0 and 1, and one whose runs
agree within a few digits (FP32, W8A8, W4A4, TWN, LSQ W4A4 and W2A2) on its seed-0 run, each against a floor for that
many runs; in this process's thread setting (measured with 1 and 2 threads: OMP_NUM_THREADS=1 and
the default of a 2-core machine; other thread counts draw other samples of the same spread). The
rule that sets each floor from the 12 runs measured (6 on each of two machines) is written above
FLOORS, and each floor carries its figures. Also checks that each quantized checkpoint is smaller
than the FP32 one, that `whittle eval` reproduces each run's accuracy from its packed file, and
that W2A2 fine-tuning, pruning and 2-rank training from the seed-0 FP32 run reach their floors.
Prints, per method, the seeds run, their figures, mean, spread and the floor.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys

BIN = os.environ["WHITTLE_BIN"]
SRC = os.environ["WHITTLE_SOURCE_DIR"]
OUT = os.path.join(os.environ["WHITTLE_BINARY_DIR"], "testdata", "recipe_accuracy")
PAIR, ONE = [0, 1], [0]

# recipe -> (seeds, floor on their mean, %; the measurement it comes from). Measured: 12 runs, seeds
# 0-2 × threads 1-2 on two machines, an AVX2 EPYC and an AVX-512 Xeon (scripts/seed_sweep.py;
# docs/results.md): their mean, standard deviation sd, range and lowest mean of any two runs.
# Floor of a two-seed mean: the lower of mean − 3·sd/√2 (three standard deviations of a two-run
# mean) and the lowest pair − 0.2 (a floor for methods whose runs agree closely on one machine,
# since another instruction set moves them more), rounded down to 0.1. Floor of one run: the lower
# of mean − 3·sd and the lowest run − 0.2, rounded down to 0.1. The test's own runs measured on
# each machine and thread count are in docs/results.md; the thinnest margins are FP32's and W8A8's
# seed-0 runs, 0.20 above their floor (98.50, AVX2 with two threads; AVX-512 with two threads).
FLOORS = {
    "lenet5": (ONE, 98.3, "FP32: mean 98.74, sd 0.13, 98.50-98.95; seed 0: 98.50-98.80"),
    "lenet5_dorefa_w8a8": (ONE, 98.3, "DoReFa W8A8: mean 98.80, sd 0.14, 98.50-98.95; seed 0: 98.50-98.80"),
    "lenet5_dorefa_w4a4": (ONE, 98.1, "DoReFa W4A4: mean 98.59, sd 0.16, 98.35-98.85; seed 0: 98.50-98.85"),
    "lenet5_dorefa_w2a2": (PAIR, 97.5, "DoReFa W2A2: mean 98.14, sd 0.29, 97.65-98.65, lowest pair 97.75"),
    "lenet5_twn": (ONE, 98.2, "TWN: mean 98.67, sd 0.14, 98.45-99.05; seed 0: 98.60-98.70"),
    "lenet5_bnn": (PAIR, 95.8, "BNN: mean 96.70, sd 0.41, 96.10-97.35, lowest pair 96.18"),
    "lenet5_xnor": (PAIR, 95.9, "XNOR-Net: mean 96.77, sd 0.37, 96.15-97.25, lowest pair 96.18"),
    # The learned-step recipes: 12 runs, seeds 0-2 × 1 and 2 threads, on one AVX-512 Xeon, 6 with its
    # AVX-512 kernels and 6 held to AVX2 (ATEN_CPU_CAPABILITY=avx2 WHITTLE_KERNEL_ISA=avx2), standing
    # for the two machines above. Seed 0 over both thread counts and both instruction sets clears the
    # floors by 0.35 (W4A4: 98.35, AVX2 with 2 threads) and 0.25 points (W2A2: 97.95, AVX2 with 1).
    "lenet5_lsq_w4a4": (ONE, 98.0, "LSQ W4A4: mean 98.60, sd 0.17, 98.35-98.90; seed 0: 98.35-98.70"),
    "lenet5_lsq_w2a2": (ONE, 97.7, "LSQ W2A2: mean 98.30, sd 0.13, 97.95-98.45; seed 0: 97.95-98.40"),
}
# What starts from the seed-0 FP32 checkpoint: one run each.
BASE_SEED = 0
# W2A2, 2 epochs from the FP32 checkpoint: measured 98.25 and 98.45 (seeds 0, 1, 2 threads;
# 98.05 and 98.40 with 1 thread; AVX2), 98.20 and 98.15 (2 threads, AVX-512); the floor is the
# from-scratch W2A2 floor, which these runs clear by more than the from-scratch ones do.
FINE_TUNE_FLOOR = 97.5
# LeNet-5 pruned to half its MACs from the FP32 checkpoint, 2 epochs of fine-tuning
# (recipes/mnist/lenet5_prune.yaml). Measured single runs (seeds 0, 1; 2 threads and 1 on AVX2,
# ATEN_CPU_CAPABILITY=default): 98.15-98.50, seed 0 98.35 (2 threads, AVX2). Floor of one run by
# the rule above: the lowest run − 0.2, rounded down.
PRUNE_FLOOR = 97.9


def run(recipe, out, *sets):
    """`whittle run` of a recipe into `out`; its report.json, or an error string."""
    cmd = [BIN, "run", f"recipes/mnist/{recipe}.yaml", "--out", out, "--overwrite"] + sum((["--set", s] for s in sets), [])
    r = subprocess.run(cmd, cwd=SRC, capture_output=True, text=True)
    if r.returncode != 0:
        return f"exit {r.returncode}: {r.stderr[-500:]}"
    return json.load(open(os.path.join(out, "report.json")))


summary = []  # the lines also written to OUT/summary.txt, which `make test` prints after CTest


def say(text):
    print(text, flush=True)
    summary.append(text)


def line(ok, name, seeds, values, floor, extra=""):
    mean = statistics.mean(values)
    cells = " ".join(f"{v:.2f}" for v in values)
    spread = f"spread {max(values) - min(values):4.2f}" if len(values) > 1 else " " * 11
    say(f"{'ok  ' if ok else 'FAIL'} {name:32s} seeds {','.join(map(str, seeds)):3s}: {cells:11s}  mean {mean:6.2f}  "
        f"{spread}  (floor {floor}){extra}")


failures = []
sizes = {}
threads = None
for name, (seeds, floor, why) in FLOORS.items():
    top1 = []
    for seed in seeds:
        out = os.path.join(OUT, name, f"seed{seed}")
        rep = run(name, out, f"training.seed={seed}")
        if isinstance(rep, str):
            failures.append(f"{name} seed {seed}: {rep}")
            continue
        threads = rep["intra_op_threads"]
        top1.append(100 * rep["test_top1"])
        sizes.setdefault(name, rep["checkpoint_bytes"])
        ev = subprocess.run([BIN, "eval", os.path.join(out, "model.h5"), "--json"], cwd=SRC, capture_output=True,
                            text=True)
        if ev.returncode != 0 or abs(json.loads(ev.stdout)["top1"] - rep["test_top1"]) > 1e-12:
            failures.append(f"{name} seed {seed}: whittle eval of the checkpoint differs from the run: "
                            f"{ev.stdout} {ev.stderr}")
    if len(top1) < len(seeds):
        continue
    ok = statistics.mean(top1) >= floor
    line(ok, name, seeds, top1, floor, f", checkpoint {sizes[name]} B")
    if not ok:
        failures.append(f"{name}: {'mean ' if len(seeds) > 1 else ''}top-1 {statistics.mean(top1):.2f} < {floor} ({why})")


def check_one(label, name, top1, floor):
    """Checks one run's top-1 (or its failure string) against `floor` and prints its line."""
    if isinstance(top1, str):
        failures.append(f"{name}: {top1}")
        return
    ok = top1 >= floor
    line(ok, label, [BASE_SEED], [top1], floor)
    if not ok:
        failures.append(f"{name}: top-1 {top1:.2f} < {floor}")


fp32_dir = os.path.join(OUT, "lenet5", f"seed{BASE_SEED}")
fp32 = os.path.join(fp32_dir, "model.h5")
# Fine-tuning from the FP32 run instead of training from scratch: 2 epochs of W2A2 QAT starting
# from the seed-0 FP32 checkpoint reach the W2A2 floor too, and write the same packed layout.
if "lenet5" in sizes:
    out = os.path.join(OUT, "lenet5_dorefa_w2a2_from_fp32", f"seed{BASE_SEED}")
    rep = run("lenet5_dorefa_w2a2", out, f"training.seed={BASE_SEED}", "training.epochs=2", "model.file=" + fp32)
    if not isinstance(rep, str) and abs(rep["checkpoint_bytes"] - sizes.get("lenet5_dorefa_w2a2", 0)) >= 2048:
        failures.append(f"fine-tuning from FP32: checkpoint {rep['checkpoint_bytes']} B vs "
                        f"{sizes.get('lenet5_dorefa_w2a2')} B from scratch")
    check_one("W2A2 fine-tuned from FP32 (2 ep)", "fine-tuning from FP32",
              rep if isinstance(rep, str) else 100 * rep["test_top1"], FINE_TUNE_FLOOR)

# Channel pruning from the FP32 run: half the MACs removed (L1, physical removal) plus 2 epochs of
# fine-tuning keep at least PRUNE_FLOOR, with a smaller checkpoint and at most half the MACs.
if "lenet5" in sizes:
    out = os.path.join(OUT, "lenet5_prune_from_fp32", f"seed{BASE_SEED}")
    rep = run("lenet5_prune", out, f"training.seed={BASE_SEED}", "model.file=" + fp32)
    if not isinstance(rep, str):
        fp32_rep = json.load(open(os.path.join(fp32_dir, "report.json")))
        if not (rep["macs_per_image"] <= 0.5 * fp32_rep["macs_per_image"] and rep["checkpoint_bytes"] < sizes["lenet5"]):
            failures.append(f"pruning from FP32: {rep['macs_per_image']} MACs (FP32 "
                            f"{fp32_rep['macs_per_image']}), {rep['checkpoint_bytes']} B (FP32 {sizes['lenet5']} B)")
    check_one("half MACs pruned (L1) + 2 ep", "pruning from FP32",
              rep if isinstance(rep, str) else 100 * rep["test_top1"], PRUNE_FLOOR)

# Data parallel: the FP32 recipe as it is (batch 64 a process, so 128 a step) on 2 local ranks
# through the .venv's torchrun (Gloo, one thread each: the thread count is fixed here) learns as one
# process does. Measured: seeds 0 and 1, 98.60 and 98.40 (AVX2); 98.55 and 98.40
# (ATEN_CPU_CAPABILITY=default); seeds 0-2, 98.40, 98.35 and 98.55 (AVX-512). Its floor by the
# one-run rule over these 7 runs (mean 98.46, sd 0.10, lowest 98.35): 98.1, 0.2 under the
# one-process floor; seed 0 is 0.3 above it at the lowest (AVX-512).
DATA_PARALLEL_FLOOR = 98.1
if "lenet5" in FLOORS:
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = os.path.join(OUT, "lenet5_2ranks", f"seed{BASE_SEED}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [torchrun, "--no-python", "--nproc-per-node=2", "--master-port=29700", BIN, "run",
           "recipes/mnist/lenet5.yaml", "--out", out, "--set", f"training.seed={BASE_SEED}"]
    r = subprocess.run(cmd, cwd=SRC, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    top1 = f"exit {r.returncode}: {r.stderr[-500:]}"
    if r.returncode == 0:
        rep = json.load(open(os.path.join(out, "report.json")))
        if rep.get("distributed", {}).get("world_size") != 2:
            failures.append(f"lenet5 on 2 ranks: report.json says {rep.get('distributed')}")
        top1 = 100 * rep["test_top1"]
    check_one("lenet5, 2 ranks (torchrun, Gloo)", "lenet5 on 2 ranks", top1, DATA_PARALLEL_FLOOR)

for name, size in sizes.items():
    if name != "lenet5" and "lenet5" in sizes and not size < sizes["lenet5"]:
        failures.append(f"{name}: checkpoint {size} B is not smaller than FP32's {sizes['lenet5']} B")
say(f"(intra-op threads: {threads}; floors and their measurements: tests/reference/recipe_accuracy_test.py)")
say(f"{len(failures)} failed" if failures else "all passed")
for f in failures:
    say("  " + f)
os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, "summary.txt"), "w") as f:
    f.write("LeNet-5 recipe accuracy (test lenet5_recipes_accuracy):\n" + "\n".join(summary) + "\n")
sys.exit(1 if failures else 0)
