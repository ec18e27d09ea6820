"""Bad input through the helper scripts: each case asserts the exit status, a one-line message naming
what is wrong and where (archive, file and line; option and path), no Python traceback, and that
nothing was created, replaced or half-written. Nothing here trains.

- scripts/gpu_cifar160.sh record DIR DEST: a metrics.jsonl line that is not JSON, or lacks
  test_top1, an archive tar cannot read beside a good one, a DEST that is a file: exit status 2,
  DEST as it was (a recorded run kept, nothing recorded from the good archive).
- scripts/run_results.py: --html and --build relative to the caller's directory, not the
  repository's; a --build without whittle or a --html into a missing folder: exit status 2; a
  failing `whittle report`: its own error and exit status 1, no file written.
- bench/micronet_cifar.py: --threads 0, --seed -1, an --out that is a file: exit status 2, nothing
  created; --out relative to the caller's directory; a --resume state that is not one (needs
  micronet: skipped without it). Every call gets a fake --fp32 run and a whittle that fails, so
  that a check that let a call through could not start training.

Run by CTest with WHITTLE_BIN, WHITTLE_SOURCE_DIR and WHITTLE_BINARY_DIR set.
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_harness import BIN, SRC, check, finish, out_dir  # noqa: E402

OUT = out_dir("scripts_bad_input")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
# python3 for gpu_cifar160.sh: the one running this test.
ENV = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def call(cmd, cwd=OUT):
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True)


def expect(r, code, needles, what):
    """Exit status `code`, every needle in stderr, one line, no traceback."""
    err = r.stderr.strip()
    needles = [needles] if isinstance(needles, str) else needles
    missing = [n for n in needles if n not in err]
    ok = r.returncode == code and not missing and "Traceback" not in err and err.count("\n") == 0
    check(ok, f"{what}: exit {r.returncode} (want {code}), '{err[-300:] or '(no message)'}'"
          + (f"; missing {missing}" if missing else ""))


def tree(d):
    """{relative path: bytes} of every file under d (None when d does not exist)."""
    if not os.path.exists(d):
        return None
    if os.path.isfile(d):
        return open(d, "rb").read()
    return {os.path.relpath(os.path.join(p, f), d): open(os.path.join(p, f), "rb").read()
            for p, _, fs in os.walk(d) for f in fs}


# --- scripts/gpu_cifar160.sh record -----------------------------------------------------------------
GPU160 = os.path.join(SRC, "scripts", "gpu_cifar160.sh")
LINE = '{"epoch": %d, "test_top1": 0.5, "train_loss": 1.0}\n'


def archive(path, metrics, finished=True):
    """A <recipe>.tar as `run` writes it: a finished run's or a resumable one's files."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files = {"metrics.jsonl": metrics.encode(), "recipe.yaml": b"model: {name: resnet20}\n"}
    files.update({"report.json": b"{}\n", "model.h5": b"h5"} if finished else {"train_state.pt": b"state"})
    with tarfile.open(path, "w") as t:
        for name, data in files.items():
            src = os.path.join(OUT, "member")
            open(src, "wb").write(data)
            t.add(src, arcname="./" + name)
    os.remove(os.path.join(OUT, "member"))


def record(d, dest):
    return call(["bash", GPU160, "record", d, dest])


dest = os.path.join(OUT, "recorded")
archive(os.path.join(OUT, "good", "resnet20.tar"), LINE % 1 + LINE % 2)
r = record(os.path.join(OUT, "good"), dest)
check(r.returncode == 0 and sorted(os.listdir(os.path.join(dest, "resnet20"))) == ["metrics.jsonl", "model.h5", "recipe.yaml", "report.json"],
      f"record: a good archive recorded ({r.stderr.strip()})")
good = tree(dest)

archive(os.path.join(OUT, "garbage", "resnet20.tar"), LINE % 1 + LINE % 2 + LINE % 3 + "garbage\n", finished=False)
r = record(os.path.join(OUT, "garbage"), dest)
expect(r, 2, [os.path.join(OUT, "garbage", "resnet20.tar"), "metrics.jsonl line 4"], "record: a garbage metrics line")
check(tree(dest) == good, "record: a garbage metrics line leaves the recorded run as it was")

archive(os.path.join(OUT, "nokey", "resnet20.tar"), LINE % 1 + LINE % 2 + '{"epoch": 3}\n')
r = record(os.path.join(OUT, "nokey"), dest)
expect(r, 2, [os.path.join(OUT, "nokey", "resnet20.tar"), "metrics.jsonl line 3", "test_top1"],
       "record: a metrics line without test_top1")
check(tree(dest) == good, "record: a metrics line without test_top1 leaves the recorded run as it was")

destfile = os.path.join(OUT, "destfile")
open(destfile, "w").write("a file\n")
r = record(os.path.join(OUT, "good"), destfile)
expect(r, 2, ["DEST " + destfile, "not a folder"], "record: DEST is a file")
check(open(destfile).read() == "a file\n", "record: DEST the file is left as it was")

# One archive unreadable: none is recorded, neither into a new DEST nor into the recorded one.
archive(os.path.join(OUT, "mixed", "a.tar"), LINE % 1)
open(os.path.join(OUT, "mixed", "b.tar"), "w").write("not a tar archive\n")
fresh = os.path.join(OUT, "fresh")
r = record(os.path.join(OUT, "mixed"), fresh)
expect(r, 2, [os.path.join(OUT, "mixed", "b.tar"), "not a readable tar archive"], "record: one archive of two unreadable")
check(not os.path.exists(fresh), "record: with an unreadable archive, the good one is not recorded (DEST not created)")
r = record(os.path.join(OUT, "mixed"), dest)
check(r.returncode == 2 and tree(dest) == good, "record: with an unreadable archive, the recorded DEST is as it was")

# --- scripts/run_results.py --------------------------------------------------------------------------
RESULTS = os.path.join(SRC, "scripts", "run_results.py")
elsewhere = os.path.join(OUT, "elsewhere")  # the caller's directory, not the repository root
os.makedirs(os.path.join(elsewhere, "mybuild"))
os.symlink(BIN, os.path.join(elsewhere, "mybuild", "whittle"))
name = "scripts_bad_input_test.html"
stray = os.path.join(SRC, name)
stray_before = os.path.exists(stray)
r = call([sys.executable, RESULTS, "--build", "mybuild", "--html", name], cwd=elsewhere)
check(r.returncode == 0 and os.path.isfile(os.path.join(elsewhere, name)) and (stray_before or not os.path.exists(stray)),
      f"run_results.py: --build and --html relative to the caller's directory ({r.stderr.strip()[-300:]})")
if not stray_before and os.path.exists(stray):
    os.remove(stray)
r = call([sys.executable, RESULTS, "--build", "mybuild"], cwd=elsewhere)
check(r.returncode == 0 and r.stdout.startswith("| method |"), f"run_results.py: the table with a relative --build ({r.stderr.strip()[-300:]})")

r = call([sys.executable, RESULTS, "--build", os.path.join(OUT, "nonexistent")])
expect(r, 2, ["--build " + os.path.join(OUT, "nonexistent"), "no whittle program"], "run_results.py: --build without whittle")
r = call([sys.executable, RESULTS, "--build", "mybuild", "--html", os.path.join("missing", "x.html")], cwd=elsewhere)
expect(r, 2, ["--html " + os.path.join("missing", "x.html"), os.path.join(elsewhere, "missing")],
       "run_results.py: --html into a missing folder")

failing = os.path.join(OUT, "failing_build")  # a whittle that fails as `whittle report` does
os.makedirs(failing)
with open(os.path.join(failing, "whittle"), "w") as f:
    f.write("#!/bin/sh\necho \"whittle $1: error: cannot write the report\" >&2\nexit 3\n")
os.chmod(os.path.join(failing, "whittle"), 0o755)
r = call([sys.executable, RESULTS, "--build", failing])
expect(r, 1, ["whittle report failed (exit status 3)", "whittle report: error: cannot write the report"],
       "run_results.py: a failing whittle report")
check(failing not in r.stderr, "run_results.py: the message is whittle's error, not the whole command")
r = call([sys.executable, RESULTS, "--build", failing, "--html", "failed.html"])
expect(r, 1, "whittle report failed", "run_results.py --html: a failing whittle report")
check(not os.path.exists(os.path.join(OUT, "failed.html")), "run_results.py --html: nothing written when whittle fails")

# --- bench/micronet_cifar.py -------------------------------------------------------------------------
MICRONET = os.path.join(SRC, "bench", "micronet_cifar.py")
fp32 = os.path.join(OUT, "fake_fp32")  # exists as the checks ask; no model loads from it
os.makedirs(fp32)
open(os.path.join(fp32, "model.h5"), "w").write("not a checkpoint\n")
json.dump({"test_top1": 0.9, "macs_per_image": 1}, open(os.path.join(fp32, "report.json"), "w"))
SAFE = ["--fp32", fp32, "--build", failing, "--threads", "1"]


def micronet(*args, cwd=OUT):
    return call([sys.executable, MICRONET, "twn", *SAFE, *args], cwd=cwd)


r = micronet("--threads", "0", "--out", "X")
expect(r, 2, "--threads 0", "micronet_cifar.py: --threads 0")
check(not os.path.exists(os.path.join(OUT, "X")) and not os.path.exists(os.path.join(SRC, "X")),
      "micronet_cifar.py: --threads 0 creates no --out directory")
r = micronet("--seed", "-1", "--out", "X")
expect(r, 2, "--seed -1", "micronet_cifar.py: --seed -1")
check(not os.path.exists(os.path.join(OUT, "X")), "micronet_cifar.py: --seed -1 creates no --out directory")
open(os.path.join(OUT, "F"), "w").write("a file\n")
r = micronet("--out", "F")
expect(r, 2, ["--out F", os.path.join(OUT, "F"), "is a file"], "micronet_cifar.py: --out naming a file")
check(open(os.path.join(OUT, "F")).read() == "a file\n", "micronet_cifar.py: the file --out names is left as it was")

# A relative --out is the caller's: its training state found there, where a resume is refused.
os.makedirs(os.path.join(elsewhere, "R"))
open(os.path.join(elsewhere, "R", "train_state.pt"), "w").write("state\n")
r = micronet("--out", "R", cwd=elsewhere)
expect(r, 2, [os.path.join(elsewhere, "R"), "holds a training state"], "micronet_cifar.py: --out relative to the caller's directory")
check(not os.path.exists(os.path.join(SRC, "R")), "micronet_cifar.py: nothing created under the repository root")

try:
    import micronet as _  # noqa: F401  (the script checks for micronet before it reads a state)
except ImportError:
    print("skipped: --resume of a corrupt state: micronet is not installed (pip install -r requirements.txt)")
else:
    r = micronet("--out", "R", "--resume", cwd=elsewhere)
    state = os.path.join(elsewhere, "R", "train_state.pt")
    expect(r, 2, ["--resume", state, "not a readable training state"], "micronet_cifar.py: --resume of a text file")
    check(open(state).read() == "state\n" and sorted(os.listdir(os.path.join(elsewhere, "R"))) == ["train_state.pt"],
          "micronet_cifar.py: the corrupt state is left as it was, nothing added")
finish()
