"""Kill anywhere: `whittle run` of a LeNet-5 DoReFa W4A4 recipe (CPU, deterministic, one thread) is
killed with SIGKILL 20 times in a row and resumed after each, then finished; it must end exactly as
the uninterrupted run (every checkpoint dataset bitwise, metrics.jsonl's figures, report.json's
top-1 and loss, the TorchScript export's outputs), and after every kill every file in the run
directory must be whole and readable (model.h5 through `whittle inspect`, which checks every CRC;
train_state.pt and model.pt as zip archives with their CRCs; metrics.jsonl line by line;
report.json). The temporaries a killed write leaves are hidden (`.<name>.tmp-<pid>-<n>`) and gone
once the next sitting starts.

The kills: 10 at random moments (seeded; during start-up, an epoch's training or its evaluation),
and 10 at chosen file operations through tests/kill_shim.c (LD_PRELOAD; WHITTLE_KILL_AT): half of a
checkpoint's or training state's bytes written (also the first
training state, when only a checkpoint exists), the temporary complete but not yet renamed or
synced, the metrics line's rename, and, at the end, the final checkpoint, the export and
report.json being written.

Usage (CTest): kill_resume_test.py KILL_SHIM_SO, with WHITTLE_BIN, WHITTLE_SOURCE_DIR,
WHITTLE_BINARY_DIR set.
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_harness import BIN, MNIST, SRC, check, failures, finish, out_dir  # noqa: E402

SHIM = os.path.abspath(sys.argv[1])
OUT = out_dir("kill_resume")
EPOCHS = 30
TEMP = re.compile(r"^\..+\.tmp-(\d+)-\d+$")

shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
RECIPE = os.path.join(OUT, "kill.yaml")
with open(RECIPE, "w") as f:
    f.write(f"""model: {{name: lenet5, num_classes: 10}}
data:
  train: {MNIST}
  test: {MNIST}
  test_split: t10k
  mean: [0.1307]
  std: [0.3081]
  batch_size: 64
  eval_batch_size: 500
  train_limit: 2048
  test_limit: 1000
  num_workers: 2
training:
  epochs: {EPOCHS}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.0005}}
  lr_schedule: {{name: cosine}}
  seed: 0
  deterministic: true
  threads: 1
modifiers:
  - {{name: quantize, method: dorefa, weight_bits: 4, activation_bits: 4, start_epoch: 1}}
outputs:
  export: [torchscript]
""")


def start(out, resume, env_extra=None):
    env = dict(os.environ)
    if env_extra:
        env.update(env_extra)
    args = [BIN, "run", RECIPE, "--out", out] + (["--resume"] if resume else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=SRC, env=env)


def drain(p, lines):
    for line in p.stdout:
        lines.append((time.monotonic(), line))


# The uninterrupted run, with the times of its epoch ends (for the random kills' range).
full = os.path.join(OUT, "full")
t0 = time.monotonic()
p = start(full, False)
lines = []
drain(p, lines)
p.wait()
check(p.returncode == 0, "uninterrupted run exits 0" + ("" if p.returncode == 0 else ": " + "".join(l for _, l in lines[-30:])))
ends = [t for t, l in lines if re.match(r"epoch \d+/\d+: test top-1", l)]
epoch_seconds = (ends[-1] - ends[0]) / max(1, len(ends) - 1) if len(ends) > 1 else 1.0
# Start-up: until the "model ..." line, printed once the data and model are loaded.
startup_seconds = next((t - t0 for t, l in lines if l.startswith("model ")), 2.0)
print(f"uninterrupted: {time.monotonic() - t0:.1f} s, start-up {startup_seconds:.2f} s, {epoch_seconds:.2f} s an epoch", flush=True)


def saved_epoch(run):
    """Epochs the run's metrics.jsonl records (0 when none)."""
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            return len([l for l in f if l.strip()])
    except FileNotFoundError:
        return 0


def check_files(run, kill):
    """Every file whittle published in `run` is whole; returns the hidden temporaries left."""
    temps = []
    if not os.path.isdir(run):  # killed before the run directory was created
        return temps
    for name in sorted(os.listdir(run)):
        path = os.path.join(run, name)
        if TEMP.match(name):
            temps.append(name)
            continue
        ok, why = True, ""
        try:
            if name == "model.h5":
                r = subprocess.run([BIN, "inspect", path], capture_output=True, text=True)
                ok, why = r.returncode == 0, r.stderr.strip()[-300:]
            elif name in ("train_state.pt", "model.pt"):
                with zipfile.ZipFile(path) as z:
                    bad = z.testzip()
                ok, why = bad is None, f"bad member {bad}"
            elif name == "metrics.jsonl":
                text = open(path).read()
                rows = [json.loads(l) for l in text.splitlines()]
                ok = (text == "" or text.endswith("\n")) and [r["epoch"] for r in rows] == list(range(1, len(rows) + 1))
                why = f"epochs {[r['epoch'] for r in rows]}"
            elif name == "report.json":
                json.load(open(path))
            elif name == "recipe.yaml":
                ok, why = open(path).read() == open(os.path.join(full, "recipe.yaml")).read(), "differs from the run's recipe"
            elif name == ".whittle.lock":
                pass
            else:
                ok, why = False, "unexpected file"
        except Exception as e:  # noqa: BLE001 (any failure to read is the finding)
            ok, why = False, repr(e)
        if not ok:
            check(False, f"kill {kill}: {name} is whole and readable ({why})")
    return temps


run = os.path.join(OUT, "killed")
rng = random.Random(20261202)
# Kill points: None = a random moment; otherwise WHITTLE_KILL_AT. The last five are reached in the
# run's final sitting (the shim's count is per sitting: "rename:model.h5:1" is the first checkpoint
# that sitting renames).
plan = [None, "write:train_state.pt:2", "write:model.h5:2", None, "rename:model.h5:1", None, "write:train_state.pt:3", None,
        "fsync:train_state.pt:1", None, "rename:metrics.jsonl:2", None, None, None, None,
        "write:report.json:1", "rename:model.h5:1", "write:model.pt:2", "rename:report.json:1", None]
kills = 0
stale = []
at_end = False  # the last kill points: the run is in its final phase (finish)
for i, point in enumerate(plan, 1):
    resume = os.path.exists(os.path.join(run, "train_state.pt"))
    env = {"LD_PRELOAD": SHIM, "WHITTLE_KILL_AT": point} if point else None
    before = saved_epoch(run)
    t_start = time.monotonic()
    p = start(run, resume, env)
    out_lines = []
    reader = threading.Thread(target=drain, args=(p, out_lines))
    reader.start()
    if point is None:
        if i == len(plan):  # the last one: in the final sitting's start-up (its finish is short)
            delay = rng.uniform(0.1, 0.9 * startup_seconds)
        else:  # during start-up, or up to one and a half epochs in (training or evaluation)
            delay = rng.uniform(0.1, startup_seconds + 1.5 * epoch_seconds)
        try:
            p.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
    p.wait()
    reader.join()
    killed = p.returncode == -signal.SIGKILL
    started = any(l.startswith("model ") for _, l in out_lines)  # past the lock and the clean-up
    where = point or f"{time.monotonic() - t_start:.2f} s, " + ("after start-up" if started else "in start-up")
    check(killed, f"kill {i} ({where}, resume={resume}, {before} epochs saved): whittle run was killed (exit {p.returncode})"
          + ("" if killed or p.returncode in (0,) else ": " + "".join(l for _, l in out_lines[-10:])))
    if not killed:
        break
    kills += 1
    # The temporaries of earlier kills are removed by the next sitting that gets going.
    left = [t for t in stale if os.path.exists(os.path.join(run, t))]
    if started:
        check(not left, f"kill {i}: the temporaries of earlier kills are gone ({left})")
    stale = sorted(set(check_files(run, i)) | set(left))
    print(f"   kill {i}: {where}, {saved_epoch(run)} epochs saved, temporaries {stale}", flush=True)
    if i == 15:  # before the final phase, fewer epochs than the run has must be saved
        check(saved_epoch(run) < EPOCHS, f"after 15 kills the run is not finished ({saved_epoch(run)} epochs)")

check(kills == len(plan), f"{kills} kills in a row")
resume = os.path.exists(os.path.join(run, "train_state.pt"))
r = subprocess.run([BIN, "run", RECIPE, "--out", run] + (["--resume"] if resume else []), capture_output=True, text=True, cwd=SRC)
check(r.returncode == 0, "the last sitting finishes the run" + ("" if r.returncode == 0 else ": " + r.stdout[-1500:] + r.stderr[-1500:]))
left = [n for n in os.listdir(run) if TEMP.match(n)]
check(not left, f"no temporaries are left ({left})")
check_files(run, "end")


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


if not failures:
    a, b = json.load(open(os.path.join(full, "report.json"))), json.load(open(os.path.join(run, "report.json")))
    check(a["test_top1"] == b["test_top1"] and a["test_loss"] == b["test_loss"],
          f"report.json: killed-and-resumed {b['test_top1']} {b['test_loss']} == uninterrupted {a['test_top1']} {a['test_loss']}")
    ma = [json.loads(l) for l in open(os.path.join(full, "metrics.jsonl"))]
    mb = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    keys = ("epoch", "train_loss", "train_top1", "test_top1", "test_top5", "test_loss", "lr", "train_images")
    check(len(ma) == len(mb) == EPOCHS and all(x[k] == y[k] for x, y in zip(ma, mb) for k in keys),
          f"metrics.jsonl: {len(mb)} lines, every epoch's figures equal")
    da, db = datasets(os.path.join(full, "model.h5")), datasets(os.path.join(run, "model.h5"))
    differ = [k for k in da if k not in db or not (np.asarray(da[k]).dtype == np.asarray(db[k]).dtype and np.array_equal(da[k], db[k]))]
    # The creation time differs by design; everything else must not.
    check(sorted(da) == sorted(db) and not differ, f"model.h5: every dataset bitwise equal ({len(da)}; differing {differ})")
    import torch
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    ya = torch.jit.load(os.path.join(full, "model.pt"))(x)
    yb = torch.jit.load(os.path.join(run, "model.pt"))(x)
    check(torch.equal(ya, yb), "model.pt: the TorchScript exports give bitwise equal outputs")

finish()
