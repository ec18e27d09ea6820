"""End-to-end checks of the `whittle` program: versions, docs in sync, a short training run, eval,
inspect against PyTorch, SIGINT + resume, and bad inputs (exit codes and messages).

Run by CTest with WHITTLE_BIN, WHITTLE_SOURCE_DIR and WHITTLE_BINARY_DIR set.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_harness import BIN, MNIST, SRC, check, finish, out_dir  # noqa: E402

OUT = out_dir("cli")


def run(*args, **kw):
    return subprocess.run([BIN, *args], capture_output=True, text=True, cwd=SRC, **kw)


def recipe(name, extra=""):
    """A quick LeNet-5 recipe on a slice of the bundled digits."""
    path = os.path.join(OUT, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"""model: {{name: lenet5}}
data:
  train: {MNIST}
  test: {MNIST}
  test_split: t10k
  mean: [0.1307]
  std: [0.3081]
  batch_size: 50
  eval_batch_size: 500
  train_limit: 2000
  test_limit: 1000
training:
  epochs: 3
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
  lr_schedule: {{name: cosine}}
  deterministic: true
  log_every: 5
  threads: 1
outputs:
  dir: {os.path.join(OUT, "runs", name)}
{extra}""")
    return path


def torch_capability():
    """ATen's CPU capability as PyTorch reports it (the same library whittle links)."""
    import torch
    return torch.backends.cpu.get_cpu_capability()


def last_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

# --version names whittle's and LibTorch's versions.
r = run("--version")
check(r.returncode == 0 and "whittle 0." in r.stdout and "LibTorch 2." in r.stdout, "--version: " + r.stdout.strip())
# ... and the ATen CPU capability and intra-op thread count, which float results depend on.
r1 = subprocess.run([BIN, "--version"], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
check(f"ATen CPU capability {torch_capability()}," in r.stdout and "intra-op threads 1 " in r1.stdout,
      "--version names the CPU capability and threads: " + r1.stdout.strip())

# docs/recipes.md holds the current key tables.
r = run("keys", "--markdown")
doc = open(os.path.join(SRC, "docs", "recipes.md")).read()
check(r.returncode == 0 and r.stdout.strip() in doc, "docs/recipes.md is up to date (scripts/update_recipe_docs.sh)")

# inspect: ResNet-20's parameter count equals PyTorch's sum(p.numel()) of the reference model.
sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
import zoo_models  # noqa: E402

r = run("inspect", "resnet20", "--input-shape", "1,3,32,32", "--json")
info = json.loads(r.stdout)
ref = zoo_models.MODELS["resnet20"][0]()
check(info["total"]["params"] == sum(p.numel() for p in ref.parameters()),
      f"inspect resnet20 params {info['total']['params']} == PyTorch {sum(p.numel() for p in ref.parameters())}")
check(40_000_000 < info["total"]["macs"] < 42_000_000, f"inspect resnet20 MACs {info['total']['macs']} about 41 M")

# inspect --ops lists the registry, compression modules' ops included.
r = run("inspect", "--ops")
check(r.returncode == 0 and "conv2d" in r.stdout and "producer_consumer" in r.stdout and "act_quant" in r.stdout
      and "threshold_sign" in r.stdout, "inspect --ops lists the registered ops")
rows = [line.split() for line in r.stdout.splitlines() if line.strip() and not line.startswith(("#", " "))]
attrs = {line.split()[0]: line for line in r.stdout.split("\nconv2d ", 1)[-1].split("\nconv_bn_qat", 1)[0].splitlines()[1:]
         if line.startswith("    ")}
check(sorted(attrs) == ["dilation", "groups", "padding", "stride"] and "int, default 1, at least 1" in attrs.get("groups", ""),
      f"inspect --ops: conv2d's attributes with their declarations ({sorted(attrs)}: {attrs.get('groups', '').strip()})")
check(all(row[2][:2] == "ot" for row in rows if row[0] != "conv_bn_qat"),
      "inspect --ops: every op but conv_bn_qat (exported as its folded layer) has ONNX and TorchScript forms")
kernel_ops = sorted(row[0] for row in rows if row[2].endswith("k"))
check(kernel_ops == ["act_quant", "add", "batch_norm", "conv2d", "flatten", "linear", "max_pool2d", "threshold_sign"],
      f"inspect --ops: the ops with a deploy kernel path are {kernel_ops}")

# A short run writes the run directory; eval reproduces its accuracy.
base = recipe("base")
r = run("run", base)
check(r.returncode == 0, "run quick recipe exits 0" + ("" if r.returncode == 0 else ": " + r.stderr[-2000:]))
run_dir = os.path.join(OUT, "runs", "base")
for f in ["recipe.yaml", "model.h5", "train_state.pt", "metrics.jsonl", "report.json"]:
    check(os.path.isfile(os.path.join(run_dir, f)), "run directory has " + f)
report = json.load(open(os.path.join(run_dir, "report.json")))
check(report["test_top1"] > 0.85, f"quick run top-1 {report['test_top1']:.4f} > 0.85")
# report.json records what float results depend on besides the recipe (the recipe sets threads: 1).
check(report.get("cpu_capability") == torch_capability() and report.get("intra_op_threads") == 1
      and report.get("seed") == 0 and report.get("deterministic") is True and report.get("torch_version", "").startswith("2."),
      "report.json records capability, threads, seed, deterministic, LibTorch: " +
      str({k: report.get(k) for k in ("cpu_capability", "intra_op_threads", "seed", "deterministic", "torch_version")}))
r = run("inspect", os.path.join(run_dir, "model.h5"), "--json")
info0 = json.loads(r.stdout)
check(r.returncode == 0 and info0["total"]["macs"] == 416_520 and "unpruned_macs" not in info0["total"],
      "inspect of the unpruned checkpoint: 416,520 MACs, no before-pruning totals")
r = run("eval", os.path.join(run_dir, "model.h5"), "--json")
ev = json.loads(r.stdout) if r.returncode == 0 else {}
# eval reads the full 2,000-image test split; the run evaluated the first 1,000.
check(r.returncode == 0 and ev.get("samples") == 2000 and ev["top1"] > 0.85, f"eval checkpoint: {ev}")

# prune: half the MACs of the trained checkpoint; inspect shows each layer and the totals before
# and after, and the pruned checkpoint evaluates.
pruned = os.path.join(OUT, "pruned.h5")
r = run("prune", os.path.join(run_dir, "model.h5"), "--criterion", "l1", "--target-macs", "0.5", "--out", pruned)
check(r.returncode == 0 and "MACs 416520 →" in r.stdout, "prune --target-macs 0.5: " + (r.stdout + r.stderr)[-400:])
r = run("inspect", pruned, "--json")
pi = json.loads(r.stdout) if r.returncode == 0 else {"total": {}, "nodes": []}
tot = pi["total"]
check(tot.get("unpruned_macs") == 416_520 and tot.get("unpruned_params") == info0["total"]["params"]
      and tot["macs"] <= 0.5 * 416_520 and tot["params"] < tot["unpruned_params"],
      f"inspect of the pruned checkpoint: totals before and after {tot}")
conv2 = next((n for n in pi["nodes"] if n["name"] == "conv2"), {})
check(conv2.get("unpruned_channels") == 16 and conv2.get("channels", 16) < 16 and conv2.get("unpruned_macs", 0) > conv2.get("macs", 0)
      and conv2.get("output_shape", [0, 0])[1] == conv2.get("channels"),
      f"inspect: conv2 before and after: {conv2}")
r = run("inspect", pruned)
check(r.returncode == 0 and "before pruning 416520 (" in r.stdout and " of 16 channels, " in r.stdout,
      "inspect text shows the layers and totals before pruning")
r = run("eval", pruned, "--json")
check(r.returncode == 0 and json.loads(r.stdout).get("samples") == 2000, "eval of the pruned checkpoint: " + r.stderr[-300:])
# The grouped, shuffled zoo model prunes through its shuffles: half of every prunable group.
r = run("prune", "nin_gc", "--sparsity", "0.5", "--out", os.path.join(OUT, "nin_gc_pruned.h5"))
check(r.returncode == 0 and "model.9.conv" in r.stdout, "prune nin_gc through its channel shuffles: " + (r.stdout + r.stderr)[-400:])

# SIGINT mid-run saves the training state; --resume ends with the same metrics as the
# uninterrupted run (deterministic mode, CPU).
intr = recipe("interrupted")
p = subprocess.Popen([BIN, "run", intr], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=SRC)
sent = False
lines = []
for line in p.stdout:
    lines.append(line)
    if not sent and line.startswith("epoch 2/3") and " 10/" in line:
        p.send_signal(signal.SIGINT)
        sent = True
p.wait()
check(sent and p.returncode == 130, f"SIGINT during epoch 2 exits 130 (got {p.returncode})")
check(any("training state saved" in l for l in lines), "SIGINT saves the training state")
r = run("run", intr, "--resume")
check(r.returncode == 0, "resume exits 0" + ("" if r.returncode == 0 else ": " + r.stderr[-2000:]))
a = last_metrics(run_dir)[-1]
b = last_metrics(os.path.join(OUT, "runs", "interrupted"))[-1]
check(a["test_top1"] == b["test_top1"] and a["test_loss"] == b["test_loss"],
      f"resumed run ends with the same metrics: {a['test_top1']} {a['test_loss']} vs {b['test_top1']} {b['test_loss']}")

# Bad inputs: exit code 2 for usage/recipe errors, 1 for runtime failures, and a message naming
# what was wrong.
def expect(args, code, needle, what):
    r = run(*args)
    msg = (r.stderr + r.stdout).strip().splitlines()
    check(r.returncode == code and needle in r.stderr, f"{what}: exit {r.returncode}, '{msg[-1] if msg else ''}'")


bad = recipe("bad_key", "trainng: {epochs: 1}\n")
expect(["run", bad], 2, "unknown key 'trainng'; did you mean 'training'?", "unknown recipe key")
expect(["run", base, "--set", "training.epochs=two"], 2, "(--set): 'training.epochs' must be an integer", "wrong type")
expect(["run", base, "--set", "data.train=/no/such/data"], 2, "/no/such/data does not exist", "missing data path")
expect(["run", os.path.join(OUT, "nope.yaml")], 2, "recipe file does not exist", "missing recipe")
expect(["run", base, "--set", "modifiers=[{name: quantise}]"], 2, "unknown modifier 'quantise'", "unknown modifier")
expect(["frobnicate"], 2, "unknown command", "unknown command")
expect(["inspect", "resnet21"], 2, "unknown model 'resnet21'", "unknown model")
expect(["inspect", "lenet5", "--input-shape", "1,1,28"], 2, "input_shape must be [N, C, H, W]", "3-D input shape")
expect(["run", base, "--device", "foo"], 2, "device 'foo': expected cpu, cuda or cuda:N", "bad --device on run")
expect(["eval", os.path.join(run_dir, "model.h5"), "--device", "cuda:x"], 2, "device 'cuda:x'", "bad --device on eval")
expect(["run", base, "--set", "model.name=lenet6"], 2, "not a zoo model", "unknown zoo model in a recipe")
expect(["run", base, "--set", "model.file=/no/such/model.h5"], 2, "/no/such/model.h5 does not exist", "missing model file")
expect(["run", base, "--set", "modifiers.0.weight_bits=4"], 2, "has no list 'modifiers', so no entry 0",
       "--set into a list the recipe lacks")
q = recipe("quantized", "modifiers:\n  - {name: quantize, method: dorefa, weight_bits: 2, activation_bits: 2}\n")
expect(["run", q, "--set", "modifiers.0.weight_bits=9"], 2, "quantized.yaml:22, modifiers.0 (with --set): modifier 'quantize'",
       "a modifier error from --set names file, line and the override")

# An image-folder archive (<split>/<class>/<image>.png inside a .tar.gz, the layout of the CIFAR-10
# JPEG archive) is a dataset for `eval --data` and `data pack` as well as for recipes.
import tarfile  # noqa: E402

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

archive_dir = os.path.join(OUT, "archive_src")
rng = np.random.default_rng(0)
for cls in ("0", "1"):
    os.makedirs(os.path.join(archive_dir, "digits", "test", cls), exist_ok=True)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), "L").save(
            os.path.join(archive_dir, "digits", "test", cls, f"{i}.png"))
archive = os.path.join(OUT, "digits.tar.gz")
with tarfile.open(archive, "w:gz") as t:
    t.add(os.path.join(archive_dir, "digits"), arcname="digits")
r = run("eval", os.path.join(run_dir, "model.h5"), "--data", archive, "--split", "test", "--json")
check(r.returncode == 0 and json.loads(r.stdout)["samples"] == 6, f"eval --data ARCHIVE.tar.gz: {r.stdout} {r.stderr[-300:]}")
packed = os.path.join(OUT, "digits-test.h5")
r = run("data", "pack", archive, "--split", "test", "--to", packed)
check(r.returncode == 0 and "packed 6 images [1, 28, 28] in 2 classes" in r.stdout,
      f"data pack ARCHIVE.tar.gz: {r.stdout.strip()} {r.stderr[-300:]}")

ckpt = os.path.join(run_dir, "model.h5")
data = open(ckpt, "rb").read()
trunc = os.path.join(OUT, "truncated.h5")
open(trunc, "wb").write(data[: len(data) // 2])
expect(["eval", trunc], 1, "truncated.h5", "truncated checkpoint")
flipped = os.path.join(OUT, "flipped.h5")
b = bytearray(data)
b[len(b) - 200] ^= 0xFF  # inside the last tensor's bytes
open(flipped, "wb").write(bytes(b))
expect(["eval", flipped], 1, "corrupted (CRC-32 mismatch)", "flipped bytes in a checkpoint")
expect(["inspect", flipped], 1, "corrupted", "inspect of a corrupted checkpoint")

# An output directory that cannot be written: exit 1 before training, earlier checkpoint intact.
blocker = os.path.join(OUT, "a_file")
open(blocker, "w").write("x")
expect(["run", base, "--out", os.path.join(blocker, "run")], 1, "cannot be written", "unwritable output directory")
# A test set whose images do not fit the model, into a directory that already holds a run: a recipe
# error before any work (exit 2), and the earlier checkpoint is untouched.
import h5py  # noqa: E402
import numpy as np  # noqa: E402

rgb = os.path.join(OUT, "rgb.h5")
with h5py.File(rgb, "w") as f:
    f["images"] = np.zeros((4, 3, 28, 28), np.uint8)
    f["labels"] = np.zeros((4,), np.int64)
before = open(ckpt, "rb").read()
r = run("run", base, "--set", "data.test=" + rgb, "--overwrite")
check(r.returncode == 2 and "'data.test' images are [3, 28, 28]" in r.stderr,
      f"images that do not fit the model: exit 2 naming data.test: {r.stderr.strip()[-300:]}")
check(open(ckpt, "rb").read() == before, "the earlier checkpoint is not damaged")

finish()
