"""Bad input through the `whittle` program: each case asserts the exit code, that the message names
the key, line, node or path at fault, that no LibTorch backtrace reaches the user, and that nothing
was created, replaced or left half-written where that applies.

Run by CTest with WHITTLE_BIN, WHITTLE_SOURCE_DIR and WHITTLE_BINARY_DIR set.
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_harness import BIN, MNIST, SRC, check, finish, out_dir  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402

OUT = out_dir("bad_input_cli")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

BASE = "recipes/mnist/lenet5.yaml"
W2A2 = "recipes/mnist/lenet5_dorefa_w2a2.yaml"
QUICK = ["--set", "data.train_limit=256", "--set", "data.test_limit=256", "--set", "training.epochs=1"]


def run(*args, **kw):
    return subprocess.run([BIN, *args], capture_output=True, text=True, cwd=SRC, **kw)


def files(d):
    return sorted(os.listdir(d)) if os.path.isdir(d) else None


def expect(args, code, needles, what, creates_nothing=None):
    """Runs whittle with `args`; checks the exit code, every needle in stderr, no backtrace, and that
    the path `creates_nothing` does not exist afterwards."""
    r = run(*args)
    err = r.stderr
    needles = [needles] if isinstance(needles, str) else needles
    missing = [n for n in needles if n not in err]
    ok = r.returncode == code and not missing and "Exception raised from" not in err and "frame #" not in err
    last = err.strip().splitlines()[-1] if err.strip() else "(no message)"
    check(ok, f"{what}: exit {r.returncode} (want {code}), '{last}'" + (f"; missing {missing}" if missing else ""))
    if creates_nothing is not None:
        check(not os.path.exists(creates_nothing), f"{what}: {creates_nothing} not created")
    return r


def inspect_json(path):
    r = run("inspect", path, "--json")
    return json.loads(r.stdout) if r.returncode == 0 else {"nodes": []}


# 1. A modifier starting inside an epoch applies from that step: the checkpoint is 2-bit.
mid = os.path.join(OUT, "mid_epoch")
r = run("run", W2A2, "--set", "training.epochs=2", "--set", "modifiers.0.start_epoch=1.5", "--set",
        "data.train_limit=512", "--set", "data.test_limit=256", "--out", mid)
bits = {n["name"]: n.get("weight_bits") for n in inspect_json(os.path.join(mid, "model.h5"))["nodes"]}
size = os.path.getsize(os.path.join(mid, "model.h5")) if r.returncode == 0 else 0
check(r.returncode == 0 and bits.get("conv2") == 2 and bits.get("fc1") == 2 and 0 < size < 60_000,
      f"start_epoch 1.5 of 2: quantized (conv2 {bits.get('conv2')} bits, fc1 {bits.get('fc1')} bits, {size} B)")
order = r.stdout.find("quantize (dorefa, W2A2"), r.stdout.find("epoch 1/2: test"), r.stdout.find("epoch 2/2: test")
check(order[1] < order[0] < order[2], "the quantizers are attached during epoch 2, after epoch 1's evaluation")
half = os.path.join(OUT, "half_epoch")
r = run("run", W2A2, *QUICK, "--set", "modifiers.0.start_epoch=0.5", "--out", half)
bits = {n["name"]: n.get("weight_bits") for n in inspect_json(os.path.join(half, "model.h5"))["nodes"]}
check(r.returncode == 0 and bits.get("conv2") == 2, f"start_epoch 0.5 of 1: quantized ({bits.get('conv2')} bits)")

# 2. Windows outside the run.
d = os.path.join(OUT, "window")
expect(["run", W2A2, *QUICK, "--set", "modifiers.0.start_epoch=5", "--out", d], 2,
       "lenet5_dorefa_w2a2.yaml:27, modifiers.0 (with --set): modifier 'quantize': start_epoch 5 is not inside the run "
       "of 1 epoch(s)",
       "start_epoch after the run", d)
expect(["run", W2A2, *QUICK, "--set", "modifiers.0.start_epoch=-3", "--out", d], 2,
       "'modifiers.0.start_epoch' is -3; it must be ≥ 0", "negative start_epoch", d)
expect(["run", W2A2, *QUICK, "--set", "modifiers.0.start_epoch=0.99", "--out", d], 2,
       "start_epoch 0.99 is after the run's last step (epoch 0.75, with 4 batches an epoch)",
       "start_epoch after the last step", d)

# 3. Zero bits.
expect(["run", W2A2, *QUICK, "--set", "modifiers.0.weight_bits=0", "--out", d], 2,
       "'modifiers.0.weight_bits' is 0; it must be in 1..32", "weight_bits 0", d)
expect(["run", W2A2, *QUICK, "--set", "modifiers.0.activation_bits=0", "--out", d], 2,
       "'modifiers.0.activation_bits' is 0; it must be in 1..32", "activation_bits 0", d)

# 4. No step.
expect(["run", BASE, *QUICK, "--set", "data.batch_size=1000000000", "--out", d], 2,
       "'data.batch_size' 1000000000 is more than the 256 training images", "a run without a step", d)

# 5. Non-finite settings; a non-finite loss stops the run and keeps the last good checkpoint.
expect(["run", BASE, *QUICK, "--set", "training.optimizer.lr=.inf", "--out", d], 2,
       "'training.optimizer.lr' is .inf; recipe numbers must be finite", "lr .inf", d)
good = os.path.join(OUT, "good")
r = run("run", BASE, *QUICK, "--out", good)
check(r.returncode == 0, "a good one-epoch run" + ("" if r.returncode == 0 else ": " + r.stderr[-500:]))
ckpt = open(os.path.join(good, "model.h5"), "rb").read()
state = open(os.path.join(good, "train_state.pt"), "rb").read()
recipe_before = open(os.path.join(good, "recipe.yaml")).read()
# Which step first overflows depends on float rounding (threads, instruction set): the message is
# checked for its form, not for the step's number.
expect(["run", BASE, *QUICK, "--set", "training.optimizer.lr=1e6", "--out", good, "--overwrite"], 1,
       ["training stopped: the loss is ", " at step ", "(epoch 1, batch ", "nothing was saved"],
       "NaN loss")
check(open(os.path.join(good, "model.h5"), "rb").read() == ckpt and
      open(os.path.join(good, "train_state.pt"), "rb").read() == state and
      open(os.path.join(good, "recipe.yaml")).read() == recipe_before and os.path.isfile(os.path.join(good, "report.json")),
      "NaN loss with --overwrite: the previous run is untouched (checkpoint, state, recipe, report)")
expect(["run", BASE, *QUICK, "--set", "training.optimizer.lr=1e6", "--out", d], 1, "training stopped: the loss is ",
       "NaN loss in a new directory", d)

# 6. Empty datasets.
empty = os.path.join(OUT, "empty.h5")
with h5py.File(empty, "w") as f:
    f["images"] = np.zeros((0, 1, 28, 28), np.uint8)
    f["labels"] = np.zeros((0,), np.int64)
packed = os.path.join(OUT, "packed.h5")
expect(["data", "pack", empty, "--to", packed], 1, "holds no images", "data pack of an empty dataset", packed)
expect(["eval", os.path.join(good, "model.h5"), "--data", empty], 1, "holds no images", "eval on an empty dataset")
expect(["run", BASE, *QUICK, "--set", "data.test=" + empty, "--out", d], 1, "holds no images",
       "run with an empty test set", d)

# 7. Duplicate keys.
dup = os.path.join(OUT, "dup.yaml")
with open(dup, "w") as f:
    f.write(f"model: {{name: lenet5}}\ndata: {{train: {MNIST}, test: {MNIST}}}\ntraining: {{epochs: 1}}\n"
            "training:\n  epochs: 2\n")
expect(["run", dup, "--out", d], 2, "dup.yaml:4: key 'training' is given twice (also at " + dup + ":3)",
       "a key given twice", d)

# 9. Loader threads: a limit up front, and a thread the system refuses is an error, not an abort.
expect(["run", BASE, *QUICK, "--set", "data.num_workers=100000", "--out", d], 2,
       "'data.num_workers' is 100000; it must be in 0..256", "num_workers 100000", d)
# Each thread reserves its stack (RLIMIT_STACK, here 1 GiB) from the address space (RLIMIT_AS, here
# 40 GiB): a few dozen loader threads fit, 256 do not.
r = subprocess.run(["bash", "-c", f"ulimit -s 1048576 && ulimit -v 41943040 && exec {BIN} run {BASE} "
                    "--set data.train_limit=256 --set data.test_limit=256 --set training.epochs=1 "
                    f"--set data.num_workers=256 --out {d}"], capture_output=True, text=True, cwd=SRC)
check(r.returncode == 1 and "could not start loader thread" in r.stderr and "terminate called" not in r.stderr,
      f"thread creation failure: exit {r.returncode}, '{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}'")
shutil.rmtree(d, ignore_errors=True)

# 11. One run at a time in a run directory; a finished one is not silently replaced.
busy = os.path.join(OUT, "busy")
slow = [BASE, "--set", "data.train_limit=4000", "--set", "data.test_limit=256", "--set", "training.epochs=3",
        "--set", "training.threads=1", "--out", busy]
first = subprocess.Popen([BIN, "run", *slow], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=SRC)
# The lock is taken when the run directory is created, before the first epoch (which takes a few
# seconds here), so the second run meets it while the first trains.
for _ in range(600):
    if os.path.exists(os.path.join(busy, ".whittle.lock")):
        break
    time.sleep(0.05)
expect(["run", *slow], 1, [busy + " is in use by another whittle run (pid " + str(first.pid) + ")"],
       "a second run into a directory in use")
first.communicate()
lines = open(os.path.join(busy, "metrics.jsonl")).read().splitlines()
check(first.returncode == 0 and [json.loads(l)["epoch"] for l in lines] == [1, 2, 3],
      f"the first run is undisturbed (exit {first.returncode}, epochs {[json.loads(l)['epoch'] for l in lines]})")
before = open(os.path.join(busy, "model.h5"), "rb").read()
expect(["run", *slow], 2, ["already holds a finished run", "--resume continues it, --overwrite replaces it"],
       "re-running into a finished run directory")
check(open(os.path.join(busy, "model.h5"), "rb").read() == before, "the finished run is untouched")
expect(["run", *slow, "--resume", "--overwrite"], 2, "give one", "--resume with --overwrite")
r = run("run", BASE, *QUICK, "--out", busy, "--overwrite")
lines = open(os.path.join(busy, "metrics.jsonl")).read().splitlines()
check(r.returncode == 0 and len(lines) == 1, f"--overwrite replaces the run ({len(lines)} metrics line)")

# 12. Range checks name the key and line, before any work.
for key, value, needle in [("training.label_smoothing", "2", "'training.label_smoothing' is 2; it must be in [0, 1)"),
                           ("data.random_crop_padding", "-5", "'data.random_crop_padding' is -5; it must be in 0..1024"),
                           ("training.threads", "-1", "'training.threads' is -1; it must be in 0..1024"),
                           ("training.lr_schedule.warmup_epochs", "-1", "'training.lr_schedule.warmup_epochs' is -1")]:
    expect(["run", BASE, *QUICK, "--set", f"{key}={value}", "--out", d], 2, "lenet5.yaml (--set): " + needle,
           f"{key}={value}", d)

# 13. Patterns that match nothing or do not compile.
expect(["run", W2A2, *QUICK, "--set", "modifiers.0.targets=[nothing_matches]", "--out", d], 2,
       "lenet5_dorefa_w2a2.yaml:27, modifiers.0 (with --set): modifier 'quantize': target pattern 'nothing_matches' "
       "matches no node of the model", "a target matching nothing", d)
expect(["run", W2A2, *QUICK, "--set", "modifiers.0.targets=['re:(']", "--out", d], 2,
       "modifiers.0 (with --set): modifier 'quantize': invalid regular expression 're:('", "a target that is no regex", d)

# 15. Messages say what the input is.
expect(["run", BASE, *QUICK, "--set", "outputs.checkpoint=", "--out", d], 2,
       "--set 'outputs.checkpoint=': no value for 'outputs.checkpoint'", "an empty outputs.checkpoint", d)
expect(["run", BASE, *QUICK, "--set", "modifiers=", "--out", d], 2,
       "--set 'modifiers=': no value for 'modifiers' (an empty list is [], an empty section {})",
       "an empty --set value for a whole list", d)
expect(["data", "pack", "/dev/null", "--to", packed], 1, "/dev/null: is a character device, not a dataset",
       "data pack /dev/null", packed)
img = os.path.join(OUT, "images", "cat")
os.makedirs(img)
open(os.path.join(img, "zero.jpg"), "wb").close()
expect(["data", "pack", os.path.join(OUT, "images"), "--to", packed], 1, "zero.jpg: empty file (0 bytes)",
       "a zero-byte image", packed)
expect(["inspect", OUT], 2, OUT + " is a directory, not a whittle checkpoint", "inspect of a directory")
expect(["eval", os.path.join(OUT, "empty_model.h5")], 2, "does not exist", "eval of a missing model")
open(os.path.join(OUT, "empty_model.pt"), "wb").close()
expect(["inspect", os.path.join(OUT, "empty_model.pt")], 2, "is an empty file", "inspect of an empty file")
# eval words an empty file or a directory as the other commands do (issue 47, item 18).
open(os.path.join(OUT, "empty_ckpt.h5"), "wb").close()
for cmd in ("eval", "inspect"):
    expect([cmd, os.path.join(OUT, "empty_ckpt.h5")], 2,
           "model file " + os.path.join(OUT, "empty_ckpt.h5") + " is an empty file, not a whittle checkpoint (.h5)",
           f"{cmd} of an empty .h5 file")
expect(["eval", OUT], 2, "model file " + OUT + " is a directory, not a whittle checkpoint", "eval of a directory")

# More bad input: each refused before anything is written.
scalar = os.path.join(OUT, "scalar.yaml")
open(scalar, "w").write("hello\n")
expect(["run", scalar, "--set", "a=1", "--out", d], 2, "the top level must be a section", "a scalar recipe with --set", d)
expect(["run", BASE, *QUICK, "--set", "outputs.checkpoint=train_state.pt", "--out", d], 2,
       "a file the run directory already uses", "a checkpoint named like the training state", d)
expect(["run", BASE, *QUICK, "--set", "training.grad_accumulation=1000", "--out", d], 2,
       "'training.grad_accumulation' 1000 is more than the 4 batches of an epoch", "grad_accumulation beyond an epoch", d)
expect(["run", BASE, *QUICK, "--set", "model.num_classes=2", "--out", d], 2,
       "has labels up to 9 but the model has 2 outputs", "fewer classes than labels", d)
expect(["run", BASE, *QUICK, "--set", "training.amp=fp16", "--out", d], 2, "applies to CUDA devices", "amp on CPU", d)
expect(["run", W2A2, *QUICK, "--set", "modifiers.0.end_epoch=0.5", "--out", d], 2,
       "the quantizers stay attached to the end", "quantize end_epoch", d)
expect(["run", W2A2, *QUICK, "--set", "modifiers.0.ignore=['re:.*']", "--out", d], 2,
       "modifier 'quantize' quantizes no layer", "quantize that quantizes nothing", d)
expect(["run", BASE, *QUICK, "--out", ""], 2, "--out is empty", "an empty --out")
inside = os.path.join(SRC, "data", "mnist10k", "packed-here.h5")
expect(["data", "pack", "data/mnist10k", "--to", inside], 2, "inside the dataset folder", "data pack into its source", inside)
expect(["fuse", os.path.join(good, "model.h5"), "--out", os.path.join(good, "model.h5")], 2, "is the input model",
       "fuse onto its input")
check(open(os.path.join(good, "model.h5"), "rb").read() == ckpt, "fuse onto its input: the checkpoint is untouched")

# 16. --set appends a modifier: BN folding after the W2A2 recipe's quantize (bn1 follows conv1, which
# stays FP32, and is folded into it).
appended = os.path.join(OUT, "appended")
r = run("run", W2A2, *QUICK, "--set", "modifiers.1={name: fuse_batchnorm}", "--out", appended)
names = [n["name"] for n in inspect_json(os.path.join(appended, "model.h5"))["nodes"]]
check(r.returncode == 0 and "conv1" in names and "bn2" in names and "bn1" not in names,
      f"--set modifiers.1={{name: fuse_batchnorm}} appends a modifier (bn1 folded: {'bn1' not in names})")

# 17. Export: bad options and models are named; nothing is written.
model = os.path.join(good, "model.h5")
eo = os.path.join(OUT, "export.onnx")
expect(["export", model, "--out", os.path.join(OUT, "export.bin")], 2, "cannot tell the format from", "export to an unknown extension")
expect(["export", model, "--out", eo, "--format", "tflite"], 2, "unknown --format 'tflite' (onnx, torchscript)", "export --format tflite", eo)
expect(["export", model, "--out", eo, "--opset", "12"], 2, "'opset': 12 is outside 13..17", "export --opset 12", eo)
expect(["export", model, "--out", eo, "--opset", "18"], 2, "'opset': 18 is outside 13..17", "export --opset 18", eo)
expect(["export", model, "--out", os.path.join(OUT, "export.pt"), "--opset", "13"], 2, "opset applies to format onnx only",
       "export --opset with TorchScript", os.path.join(OUT, "export.pt"))
expect(["export", model, "--out", model], 2, "is the input model", "export onto its input")
check(open(model, "rb").read() == ckpt, "export onto its input: the checkpoint is untouched")
expect(["export", os.path.join(OUT, "no_such_model.h5"), "--out", eo], 2, "does not exist", "export of a missing model", eo)
expect(["export", model], 2, "missing --out FILE", "export without --out")
expect(["run", BASE, *QUICK, "--set", "outputs.export=[onnx, tflite]", "--out", d], 2,
       "'outputs.export' is 'tflite'", "outputs.export with an unknown format", d)
expect(["run", BASE, *QUICK, "--set", "outputs.export=[torchscript]", "--set", "outputs.checkpoint=train_state.h5", "--out", d], 2,
       "would write 'train_state.pt', a file the run directory uses", "outputs.export onto the training state", d)
expect(["run", BASE, *QUICK, "--set", "outputs.onnx_opset=18", "--out", d], 2, "outputs.onnx_opset", "outputs.onnx_opset 18", d)
expect(["run", BASE, *QUICK, "--set", "outputs.export=[onnx, onnx]", "--out", d], 2, "names onnx twice", "outputs.export twice onnx", d)
expect(["run", BASE, *QUICK, "--set", "outputs.export=[torchscript]", "--set", "outputs.onnx_opset=13", "--out", d], 2,
       "applies when 'outputs.export' has onnx", "outputs.onnx_opset without an ONNX export", d)
# Both output paths are checked before either is written.
expect(["export", model, "--out", eo, "--check-data", OUT], 2, "--check-data " + OUT + " is a directory",
       "export --check-data onto a directory", eo)
expect(["export", model, "--out", eo, "--check-data", os.path.join(OUT, "no_dir", "x.h5")], 2, "not a folder to write into",
       "export --check-data into a missing folder", eo)
expect(["export", model, "--out", eo, "--input-shape", "1,3,32,32"], 2, "apply to TorchScript files and zoo models",
       "export of a checkpoint with --input-shape", eo)


# 18. A damaged training state, a finished run resumed, a report onto a run's own files, impossible
# report figures, model keys a file does not use, a second YAML document, a huge input shape.
import struct  # noqa: E402
import zipfile  # noqa: E402

fin = os.path.join(OUT, "finished")
shutil.copytree(good, fin)


def snapshot(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}


before = snapshot(fin)
r = run("run", BASE, *QUICK, "--out", fin, "--resume")
check(r.returncode == 0 and "has finished (epoch 1 of 1, report.json): nothing to resume" in r.stderr + r.stdout,
      f"--resume of a finished run: nothing to do (exit {r.returncode})")
check(snapshot(fin) == before, "--resume of a finished run: every file byte for byte as before")
# --resume auto (a job wrapper that always passes it): resumes where a training state is, starts
# where none is; any other value of --resume is refused.
r = run("run", BASE, *QUICK, "--out", fin, "--resume", "auto")
check(r.returncode == 0 and "nothing to resume" in r.stderr + r.stdout and snapshot(fin) == before,
      f"--resume auto of a finished run: nothing to do, nothing written (exit {r.returncode})")
fresh = os.path.join(OUT, "resume_auto_fresh")
shutil.rmtree(fresh, ignore_errors=True)
r = run("run", "--resume", "auto", BASE, *QUICK, "--out", fresh)
check(r.returncode == 0 and os.path.isfile(os.path.join(fresh, "report.json")),
      f"--resume auto where no run is: the run starts and finishes (exit {r.returncode})")
expect(["run", BASE, *QUICK, "--out", fresh, "--resume=later"], 2, "--resume takes no value, or 'auto'", "--resume=later")
expect(["run", BASE, *QUICK, "--out", fresh, "--resume", "auto", "--overwrite"], 2, "give one", "--resume auto with --overwrite")
# A flipped tensor byte: LibTorch's reader does not check the zip CRCs, whittle does; nothing is
# written (the checkpoint stays that of the last good epoch).
state_path = os.path.join(fin, "train_state.pt")
with zipfile.ZipFile(state_path) as z:
    big = max(z.infolist(), key=lambda i: i.file_size)
blob = bytearray(open(state_path, "rb").read())
name_len, extra_len = struct.unpack("<HH", blob[big.header_offset + 26:big.header_offset + 30])
blob[big.header_offset + 30 + name_len + extra_len + 64] ^= 0x40
open(state_path, "wb").write(bytes(blob))
os.remove(os.path.join(fin, "report.json"))  # as if stopped while finishing: the state is read
before = snapshot(fin)
expect(["run", BASE, *QUICK, "--out", fin, "--resume"], 1,
       [state_path + " is not a readable training state (truncated or damaged): record ", "fails its check", "CRC"],
       "--resume from a training state with a flipped byte")
check(snapshot(fin) == before, "a damaged training state: nothing written")

# whittle report: the page may not replace a run's files; figures no run can have are refused.
rep_json = os.path.join(good, "report.json")
rep_before = open(rep_json, "rb").read()
r = expect(["report", good, "--html", rep_json], 2, "would replace a file of the run in " + good, "report --html onto report.json")
check(open(rep_json, "rb").read() == rep_before and r.stdout == "", "report --html onto report.json: untouched, no table printed")
expect(["report", good, "--html", os.path.join(good, "model.h5")], 2, "would replace a file of the run",
       "report --html onto the checkpoint")
check(open(os.path.join(good, "model.h5"), "rb").read() == ckpt, "report --html onto the checkpoint: untouched")

# An existing destination is replaced only with --overwrite (issue: `data pack --to ckpt.h5` replaced
# a trained checkpoint; export, fuse, prune and report --html replaced any file).
keep = os.path.join(OUT, "keep")
os.makedirs(keep, exist_ok=True)
for cmd, dest in [(["data", "pack", "data/mnist10k", "--split", "t10k", "--to"], "ckpt.h5"),
                  (["export", model, "--out"], "m.onnx"),
                  (["export", model, "--out"], "m.pt"),
                  (["fuse", model, "--out"], "fused.h5"),
                  (["prune", model, "--sparsity", "0.25", "--out"], "pruned.h5"),
                  (["report", good, "--html"], "page.html")]:
    target = os.path.join(keep, dest)
    open(target, "wb").write(ckpt)
    what = f"{cmd[0]} {cmd[1] if cmd[0] == 'data' else ''} onto an existing {dest}".replace("  ", " ")
    expect(cmd + [target], 2, [target + " exists (a file of " + str(len(ckpt)) + " bytes); give --overwrite to replace it"],
           what)
    check(open(target, "rb").read() == ckpt, what + ": untouched")
    r = run(*cmd, target, "--overwrite")
    check(r.returncode == 0 and open(target, "rb").read() != ckpt, what + " with --overwrite: replaced (exit %d %s)" % (r.returncode, r.stderr.strip()[-200:]))
r = expect(["report", good, "--html", os.path.join(OUT, "no_dir", "r.html")], 2, os.path.join(OUT, "no_dir") + " is missing (not a folder to write into)",
           "report --html into a missing folder")
check(r.stdout == "", "report --html into a missing folder: refused before the table is printed")
odd = os.path.join(OUT, "odd_report")
for field, value, needle in [("test_top1", 7.5, "test_top1 (a fraction) is 7.5, not within [0, 1]"),
                             ("test_top5", -3, "test_top5 (a fraction) is -3"),
                             ("checkpoint_bytes", -100, "checkpoint_bytes is -100"),
                             ("epochs", -5, "epochs is -5")]:
    shutil.rmtree(odd, ignore_errors=True)
    shutil.copytree(good, odd)
    rep = json.load(open(os.path.join(odd, "report.json")))
    rep[field] = value
    json.dump(rep, open(os.path.join(odd, "report.json"), "w"))
    expect(["report", odd], 1, [os.path.join(odd, "report.json"), needle], f"report with {field} {value}")
shutil.rmtree(odd, ignore_errors=True)
shutil.copytree(good, odd)
lines = open(os.path.join(odd, "metrics.jsonl")).read().splitlines()
m = json.loads(lines[0])
m["test_top1"] = 1e308
open(os.path.join(odd, "metrics.jsonl"), "w").write(json.dumps(m) + "\n")
expect(["report", odd], 1, [os.path.join(odd, "metrics.jsonl") + ":1: test_top1 (a fraction) is 1e+308"],
       "report with a metrics line's test_top1 1e308")
os.remove(os.path.join(odd, "metrics.jsonl"))
os.makedirs(os.path.join(odd, "metrics.jsonl"))
expect(["report", odd], 1, "metrics.jsonl is a directory, not a file of metrics lines", "report with metrics.jsonl a directory")

# A model file brings its own classifier, weights and input: a num_classes or input_shape beside it
# must be its own, a weight_init is an error, and --set model.file drops the recipe's weight_init.
expect(["run", BASE, *QUICK, "--set", "model.file=" + model, "--set", "model.num_classes=7", "--out", d], 2,
       "'model.num_classes' is 7 but the model of 'model.file' " + model + " has 10 outputs", "model.file with another model.num_classes", d)
expect(["run", BASE, *QUICK, "--set", "model.file=" + model, "--set", "model.weight_init=kaiming_normal", "--out", d], 2,
       "'model.weight_init' applies to zoo models", "model.file with model.weight_init", d)
expect(["run", BASE, *QUICK, "--set", "model.file=" + model, "--set", "model.input_shape=[1,1,32,32]", "--out", d], 2,
       "'model.input_shape' is [1, 1, 32, 32] but the model of 'model.file' " + model + " takes [1, 1, 28, 28]",
       "model.file with another model.input_shape", d)
two_docs = os.path.join(OUT, "two_docs.yaml")
open(two_docs, "w").write(open(os.path.join(SRC, BASE)).read() + "---\nfoo: 1\n")
n_lines = open(two_docs).read().count("\n")
expect(["run", two_docs, *QUICK, "--out", d], 2, f"two_docs.yaml:{n_lines}: a second YAML document", "a recipe of two YAML documents", d)
expect(["inspect", "resnet20", "--input-shape", "1,3,99999999999,99999999999"], 2, "has more than 2^40 elements",
       "inspect with a 10^22-element input")
expect(["run", BASE, *QUICK, "--set", "model.input_shape=[1,1,2000000,2000000]", "--out", d], 2,
       "'model.input_shape' has more than 2^40 elements", "model.input_shape of 4·10^12 elements", d)

# eval of a model on images of another shape names both shapes (not the transform's channel count).
r20 = os.path.join(OUT, "resnet20.h5")
r = run("fuse", "resnet20", "--out", r20)
check(r.returncode == 0, "a ResNet-20 checkpoint (fuse of the zoo model)")
expect(["eval", r20, "--data", MNIST, "--split", "t10k"], 2,
       "the images of " + MNIST + " are [1, 28, 28] (C, H, W) but the model " + r20 + " takes [3, 32, 32]",
       "eval of a 3×32×32 model on 1×28×28 digits")

# calibrate: each bad input named, exit 2, no file written.
int8 = os.path.join(OUT, "int8.h5")
expect(["calibrate", model, "--method", "kl", "--out", int8], 2, "key 'calibrator': unknown 'kl'",
       "calibrate --method of no calibrator", int8)
expect(["calibrate", model, "--batches", "0", "--out", int8], 2, "calibrate: --batches must be ≥ 1", "calibrate --batches 0", int8)
expect(["calibrate", model, "--batches", "100000", "--out", int8], 2, "calibrate: --batches 100000 is more than the ",
       "calibrate over more batches than the data has", int8)
expect(["calibrate", model], 2, "calibrate: missing --out FILE", "calibrate without --out")
expect(["calibrate", model, "--mean", "0.1,x", "--out", int8], 2, "calibrate: --mean '0.1,x' is not a comma-separated list of numbers",
       "calibrate --mean not numbers", int8)
expect(["calibrate", "resnet20", "--out", int8], 2, "calibrate: resnet20 holds no recipe naming a training set; give --data",
       "calibrate of a zoo model without --data", int8)
expect(["calibrate", r20, "--data", MNIST, "--out", int8], 2,
       "calibrate: the images of " + MNIST + " are [1, 28, 28] (C, H, W) but the model " + r20 + " takes [3, 32, 32]",
       "calibrate of a 3×32×32 model on 1×28×28 digits", int8)
expect(["calibrate", model, "--activation-dtype", "int4", "--out", int8], 2, "'int4' is not one of uint8, int8",
       "calibrate --activation-dtype int4", int8)
expect(["calibrate", os.path.join(mid, "model.h5"), "--data", MNIST, "--out", int8], 2,
       "model.h5 is quantized already (node '", "calibrate of a quantized checkpoint", int8)
r = run("calibrate", "lenet5", "--data", MNIST, "--batches", "1", "--out", int8)
check(r.returncode == 0 and "no normalization (--mean, --std) given and none stored with lenet5" in r.stderr,
      "calibrate of a zoo model without --mean/--std says the images go in unnormalized")
if os.path.exists(int8):
    os.remove(int8)
expect(["calibrate", model, "--method", "", "--out", int8], 2, "key 'calibrator': unknown ''", "calibrate --method ''", int8)
expect(["calibrate", model, "--targets", "nosuch", "--out", int8], 2, "target 'nosuch' is neither a node",
       "calibrate --targets of no layer (exit 2: a usage error)", int8)
expect(["calibrate", model, "--method", "percentile", "--percentile", "0.99", "--out", int8], 2,
       "key 'percentile': 0.99 is outside [50, 100)", "calibrate --percentile 0.99 (a fraction for a percent)", int8)

# fuse, prune and data pack check their output before any work: nothing printed, nothing written.
for args, what in [(["fuse", model, "--out", os.path.join(OUT, "no_dir", "f.h5")], "fuse"),
                   (["prune", model, "--sparsity", "0.5", "--out", os.path.join(OUT, "no_dir", "p.h5")], "prune"),
                   (["data", "pack", MNIST, "--split", "t10k", "--to", os.path.join(OUT, "no_dir", "d.h5")], "data pack")]:
    r = expect(args, 2, [what + ": cannot write", os.path.join(OUT, "no_dir") + " is missing (not a folder to write into)"],
               f"{what} into a missing folder")
    check(r.stdout == "" and not os.path.exists(os.path.join(OUT, "no_dir")), f"{what} into a missing folder: refused before any work")
expect(["fuse", model, "--out", OUT], 2, "fuse: --out " + OUT + " is a directory", "fuse --out a directory")

expect(["fuse", model, "--out", os.path.join(OUT, "new_dir") + "/"], 2, "is a directory", "fuse --out a name ending in /")
fifo = os.path.join(OUT, "out.fifo")
os.mkfifo(fifo)
r = expect(["fuse", model, "--out", fifo], 2, "fuse: --out " + fifo + " is a FIFO, not a file to replace", "fuse --out a FIFO")
check(r.stdout == "", "fuse --out a FIFO: refused before any work")

# Options that would be ignored, or would quietly change what is done, are refused.
pruned = os.path.join(OUT, "pruned.h5")
expect(["prune", model, "--ignore", "nosuch", "--out", pruned], 2,
       "prune: --ignore pattern 'nosuch' matches no node of the model", "prune --ignore of no node", pruned)
expect(["prune", model, "--targets", "re:zzz", "--out", pruned], 2,
       "prune: --targets pattern 're:zzz' matches no node of the model", "prune --targets matching nothing", pruned)
expect(["prune", model, "--target-macs", "0", "--out", pruned], 2,
       "prune: --target-macs: 0 is outside (0, 1]", "prune --target-macs 0", pruned)
expect(["prune", model, "--round-to", "1000", "--out", pruned], 2,
       ["prune: nothing would be removed: ", "keep every channel with these amounts (--round-to 1000"],
       "prune that removes nothing", pruned)
expect(["fuse", model, "--targets", "nosuch", "--out", pruned], 2,
       "fuse: --targets pattern 'nosuch' matches no node of the model", "fuse --targets of no node", pruned)
expect(["prune", model, "--criterion", "taylor", "--out", pruned], 2,
       "prune: --criterion: 'taylor' needs gradients from training", "prune --criterion taylor", pruned)
expect(["prune", model, "--round-to", "1.5", "--out", pruned], 2,
       "prune: --round-to: ", "prune --round-to not an integer", pruned)
expect(["prune", model, "--target-macs", "0.5", "--sparsity", "0.3", "--out", pruned], 2,
       "prune: give one of --sparsity, --target-macs and --target-params", "prune --target-macs with --sparsity", pruned)
for cmd in (["fuse", model, "--out", pruned], ["prune", model, "--out", pruned], ["inspect", model]):
    expect(cmd + ["--input-shape", "1,3,99,99"], 2,
           cmd[0] + ": --input-shape and --num-classes apply to TorchScript files and zoo models; " + model +
           " is a checkpoint, which keeps its own", cmd[0] + " --input-shape of a checkpoint", pruned)
expect(["inspect", model, "--num-classes", "7"], 2, "inspect: --input-shape and --num-classes apply",
       "inspect --num-classes of a checkpoint")
for threads in ("100000", "4294967297", "-1"):
    expect(["bench", model, "--threads", threads, "--repeat", "1"], 2,
           "bench: --threads must be in 0..1024 (0: LibTorch's default), got " + threads, f"bench --threads {threads}")
expect(["eval", model, "--data", ""], 2, "eval: --data is empty", "eval --data ''")
# eval without --data takes the test set its checkpoint's stored recipe names; gone, it says whose.
moved = os.path.join(OUT, "mnist_moved")
shutil.copytree(MNIST, moved)
gone = os.path.join(OUT, "gone_data_run")
r = run("run", BASE, *QUICK, "--set", "data.train=" + moved, "--set", "data.test=" + moved, "--out", gone)
check(r.returncode == 0, f"a run on a copy of the digits ({r.stderr.strip()[-200:]})")
shutil.rmtree(moved)
expect(["eval", os.path.join(gone, "model.h5")], 2,
       ["eval: the test set " + moved + " named by " + os.path.join(gone, "model.h5") +
        "'s stored recipe (data.test) does not exist here; give --data"], "eval of a checkpoint whose test set is gone")

# An input whose first activation passes 2^40 elements is refused when the model is read; a batch
# whose activations do not fit memory (ResNet-20: 128 kB an image) before anything is allocated.
expect(["bench", "resnet20", "--input-shape", "1,3,400000,400000", "--repeat", "1"], 1,
       ["node 'conv1' (conv2d): output shape [1, 16, 400000, 400000] has more than 2^40 elements"],
       "bench of an input no machine holds")
expect(["bench", "resnet20", "--batch", "1000000", "--repeat", "1"], 2,
       ["bench: --batch 1000000 needs at least 122.1 GiB for resnet20's activations, more than the "],
       "bench --batch 1000000 (minutes of swapping, silently, before)")
# `whittle help CMD` is CMD's help; arguments after --version or --help are refused.
r = run("help", "run")
check(r.returncode == 0 and r.stdout.startswith("usage: whittle run RECIPE"), f"whittle help run: {r.stdout[:60]!r}")
expect(["--version", "extra"], 2, "whittle: --version takes no arguments (got 'extra')", "--version with an argument")

# report: a run given twice (also through another spelling of its path), a path that is not there.
expect(["report", good, good + "/"], 2, "report: " + good + "/ is given twice (also as " + good + ")", "report of one run twice")
expect(["report", os.path.join(OUT, "nosuch_run")], 2, os.path.join(OUT, "nosuch_run") + " does not exist",
       "report of a run directory that is not there")
# --resume where the training state is a folder says what it is.
odd_state = os.path.join(OUT, "state_is_a_folder")
os.makedirs(os.path.join(odd_state, "train_state.pt"))
expect(["run", BASE, *QUICK, "--out", odd_state, "--resume"], 1,
       "the training state " + os.path.join(odd_state, "train_state.pt") + " is a directory, not a file",
       "--resume with train_state.pt a folder")

# Output that cannot be written (a full disk: /dev/full) is a failure, not a result: exit 1, said.
if os.path.exists("/dev/full"):
    for cmd in (["keys"], ["inspect", "lenet5"], ["inspect", "--passes"], ["eval", model, "--json"],
                ["report", good, "--json"], ["bench", "lenet5", "--repeat", "1"], ["--version"]):
        with open("/dev/full", "w") as full:
            r = subprocess.run([BIN, *cmd], stdout=full, stderr=subprocess.PIPE, text=True, cwd=SRC)
        check(r.returncode == 1 and "cannot write to standard output" in r.stderr and "frame #" not in r.stderr,
              f"{' '.join(cmd)} > /dev/full: exit {r.returncode} (want 1), '{r.stderr.strip()[-120:]}'")

# A folder holding a file of a run's name that no run left there is not replaced (--overwrite does).
mine = os.path.join(OUT, "users_folder")
os.makedirs(mine)
open(os.path.join(mine, "model.h5"), "w").write("my own model")
expect(["run", BASE, *QUICK, "--out", mine], 2,
       ["run directory " + mine + " holds model.h5 but no metrics.jsonl, so no whittle run left them", "--overwrite replaces them"],
       "run --out a folder holding the user's model.h5")
check(open(os.path.join(mine, "model.h5")).read() == "my own model" and files(mine) == ["model.h5"],
      "run --out a folder holding the user's model.h5: the file is as it was, nothing added")

finish()
