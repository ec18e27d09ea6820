"""Resume across graph changes: a LeNet-5 QAT recipe whose `quantize` modifier starts at epoch 1
and whose `fuse_batchnorm` (mode qat) freezes the BN statistics at epoch 2 is interrupted with
SIGINT in epoch 2 (after quantizers and QAT-folded layers were added) and again in epoch 3 (after
the freeze), resumed each time, and must end exactly as the uninterrupted run: every dataset of the
final checkpoint (h5py) and test_top1 / test_loss of report.json and metrics.jsonl equal. The
optimizer has three weight-decay groups (norm_weight_decay, bias_weight_decay), so the folded BN's
γ and β, new tensors at the fold, must keep theirs through the rebuild and the resume. Also: a
resume with another recipe text is refused, naming the training state.

Run by CTest with WHITTLE_BIN, WHITTLE_SOURCE_DIR and WHITTLE_BINARY_DIR set.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_harness import BIN, MNIST, SRC, check, failures, finish, out_dir  # noqa: E402

OUT = out_dir("resume")


shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
RECIPE = os.path.join(OUT, "qat_resume.yaml")
with open(RECIPE, "w") as f:
    f.write(f"""model: {{name: lenet5, num_classes: 10}}
data:
  train: {MNIST}
  test: {MNIST}
  test_split: t10k
  mean: [0.1307]
  std: [0.3081]
  batch_size: 64
  eval_batch_size: 1000
  train_limit: 2048
  test_limit: 1000
  num_workers: 2
training:
  epochs: 3
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.0005,
              norm_weight_decay: 0, bias_weight_decay: 0.0001}}
  lr_schedule: {{name: cosine}}
  seed: 0
  deterministic: true
  threads: 1
  log_every: 2
modifiers:
  - {{name: quantize, method: dorefa, weight_bits: 4, activation_bits: 4, start_epoch: 1}}
  - {{name: fuse_batchnorm, mode: qat, start_epoch: 1, freeze_bn_epoch: 2}}
""")


def run_until(out, prefix, extra=()):
    """Runs the recipe into `out`; sends SIGINT at the progress line of batch 10 of the epoch that
    `prefix` names ("epoch 2/3"). Returns (exit code, whether the signal was sent, output lines)."""
    p = subprocess.Popen([BIN, "run", RECIPE, "--out", out, *extra], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=SRC)
    sent = False
    lines = []
    for line in p.stdout:
        lines.append(line)
        if not sent and line.startswith(prefix) and " 10/" in line:
            p.send_signal(signal.SIGINT)
            sent = True
    p.wait()
    return p.returncode, sent, lines


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        f.visititems(visit)
    return out


def report(run_dir):
    return json.load(open(os.path.join(run_dir, "report.json")))


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


full = os.path.join(OUT, "full")
r = subprocess.run([BIN, "run", RECIPE, "--out", full], capture_output=True, text=True, cwd=SRC)
check(r.returncode == 0, "uninterrupted run exits 0" + ("" if r.returncode == 0 else ": " + r.stdout[-2000:] + r.stderr[-2000:]))

part = os.path.join(OUT, "interrupted")
code, sent, lines = run_until(part, "epoch 2/3")
check(sent and code == 130, f"SIGINT in epoch 2 (quantized, QAT-folded graph) exits 130 (got {code})")
check(any("training state saved" in l for l in lines), "SIGINT saves the training state")
code, sent, lines = run_until(part, "epoch 3/3", ["--resume"])
check(any(l.startswith("resuming ") and "at epoch 2" in l for l in lines), "the first resume continues in epoch 2")
check(any("BN statistics frozen" in l for l in lines), "the resumed run freezes the BN statistics at epoch 2")
check(not any(l.startswith("quantize (") or l.startswith("qat_batchnorm:") for l in lines),
      "the resumed run does not quantize or fold again")
check(sent and code == 130, f"SIGINT in epoch 3 (BN statistics frozen) exits 130 (got {code})")
r = subprocess.run([BIN, "run", RECIPE, "--out", part, "--resume"], capture_output=True, text=True, cwd=SRC)
check(r.returncode == 0, "second resume exits 0" + ("" if r.returncode == 0 else ": " + r.stdout[-2000:] + r.stderr[-2000:]))
check("BN statistics frozen" not in r.stdout, "the second resume does not freeze again")

if not failures:
    a, b = report(full), report(part)
    check(a["test_top1"] == b["test_top1"] and a["test_loss"] == b["test_loss"],
          f"report.json: resumed {b['test_top1']} {b['test_loss']} == uninterrupted {a['test_top1']} {a['test_loss']}")
    ma, mb = metrics(full), metrics(part)
    check(len(ma) == len(mb) == 3, f"metrics.jsonl has one line per epoch ({len(ma)}, {len(mb)})")
    same = all(x[k] == y[k] for x, y in zip(ma, mb) for k in ("epoch", "train_loss", "train_top1", "test_top1", "test_loss"))
    check(same, "metrics.jsonl: every epoch's train and test figures equal")
    da = datasets(os.path.join(full, "model.h5"))
    db = datasets(os.path.join(part, "model.h5"))
    check(sorted(da) == sorted(db), f"checkpoints hold the same datasets ({len(da)})")
    differ = [k for k in da if k in db and not (np.asarray(da[k]).dtype == np.asarray(db[k]).dtype
                                                 and np.array_equal(da[k], db[k]))]
    check(not differ, f"every checkpoint dataset is bitwise equal ({len(da)} datasets; differing: {differ})")

# Resuming with another recipe text is refused, naming the training state.
r = subprocess.run([BIN, "run", RECIPE, "--out", part, "--resume", "--set", "training.epochs=4"],
                   capture_output=True, text=True, cwd=SRC)
check(r.returncode == 2 and "the recipe differs" in r.stderr and "train_state.pt" in r.stderr,
      f"resume with another recipe is refused: exit {r.returncode}, {r.stderr.strip()[-300:]}")
# Resuming where there is nothing to resume names the missing file.
r = subprocess.run([BIN, "run", RECIPE, "--out", os.path.join(OUT, "never_run"), "--resume"],
                   capture_output=True, text=True, cwd=SRC)
check(r.returncode == 1 and "no training state at" in r.stderr, f"resume without a state: exit {r.returncode}, {r.stderr.strip()[-200:]}")

finish()
