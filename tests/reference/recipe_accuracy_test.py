"""Trains every shipped LeNet-5 recipe on the bundled MNIST digits (8 epochs each, about a minute
in all on 2 cores) and checks top-1 on the 2,000 test digits against the floors the project
promises (a plain PyTorch loop with the same quantizer definitions reaches 98.15, 97.70, 97.75,
97.35, 98.15, 96.35 and 97.45 %). Also checks that each quantized checkpoint is smaller than the
FP32 one, that `whittle eval` reproduces the run's accuracy from the packed file, and that W2A2
fine-tuned from the FP32 checkpoint (`--set model.file=...`) reaches its floor as well.
"""
import json
import os
import subprocess
import sys

BIN = os.environ["WHITTLE_BIN"]
SRC = os.environ["WHITTLE_SOURCE_DIR"]
OUT = os.path.join(os.environ["WHITTLE_BINARY_DIR"], "testdata", "recipe_accuracy")

FLOORS = {  # recipe -> minimum top-1 (%)
    "lenet5": 98.0,
    "lenet5_dorefa_w8a8": 97.5,
    "lenet5_dorefa_w4a4": 97.5,
    "lenet5_dorefa_w2a2": 97.0,
    "lenet5_twn": 97.8,
    "lenet5_bnn": 96.0,
    "lenet5_xnor": 97.0,
}
failures = []
sizes = {}
for name, floor in FLOORS.items():
    out = os.path.join(OUT, name)
    r = subprocess.run([BIN, "run", f"recipes/mnist/{name}.yaml", "--out", out], cwd=SRC, capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{name}: exit {r.returncode}: {r.stderr[-500:]}")
        continue
    rep = json.load(open(os.path.join(out, "report.json")))
    top1 = 100 * rep["test_top1"]
    sizes[name] = rep["checkpoint_bytes"]
    ok = top1 >= floor
    print(f"{'ok  ' if ok else 'FAIL'} {name:22s} top-1 {top1:6.2f} % (floor {floor}), checkpoint {rep['checkpoint_bytes']} B")
    if not ok:
        failures.append(f"{name}: top-1 {top1:.2f} < {floor}")
    ev = subprocess.run([BIN, "eval", os.path.join(out, "model.h5"), "--json"], cwd=SRC, capture_output=True, text=True)
    if ev.returncode != 0 or abs(json.loads(ev.stdout)["top1"] - rep["test_top1"]) > 1e-12:
        failures.append(f"{name}: whittle eval of the checkpoint differs from the run: {ev.stdout} {ev.stderr}")
# Fine-tuning from the FP32 run instead of training from scratch: 2 epochs of W2A2 QAT starting from
# the FP32 checkpoint reach the W2A2 floor too (97.55 % measured) and write the same packed layout.
if "lenet5" in sizes:
    out = os.path.join(OUT, "lenet5_dorefa_w2a2_from_fp32")
    r = subprocess.run([BIN, "run", "recipes/mnist/lenet5_dorefa_w2a2.yaml", "--out", out, "--set", "training.epochs=2",
                        "--set", "model.file=" + os.path.join(OUT, "lenet5", "model.h5")],
                       cwd=SRC, capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"fine-tuning from FP32: exit {r.returncode}: {r.stderr[-500:]}")
    else:
        rep = json.load(open(os.path.join(out, "report.json")))
        top1 = 100 * rep["test_top1"]
        ok = top1 >= 97.0 and abs(rep["checkpoint_bytes"] - sizes.get("lenet5_dorefa_w2a2", 0)) < 2048
        print(f"{'ok  ' if ok else 'FAIL'} W2A2 fine-tuned from FP32, 2 epochs: top-1 {top1:6.2f} % (floor 97.0), "
              f"checkpoint {rep['checkpoint_bytes']} B")
        if not ok:
            failures.append(f"fine-tuning from FP32: top-1 {top1:.2f} (floor 97.0), {rep['checkpoint_bytes']} B "
                            f"vs {sizes.get('lenet5_dorefa_w2a2')} B from scratch")
for name, size in sizes.items():
    if name != "lenet5" and "lenet5" in sizes and not size < sizes["lenet5"]:
        failures.append(f"{name}: checkpoint {size} B is not smaller than FP32's {sizes['lenet5']} B")
print(f"{len(failures)} failed" if failures else "all passed")
for f in failures:
    print("  " + f)
sys.exit(1 if failures else 0)
