"""scripts/gpu_cifar160.sh, the prepared GPU run of the 160-epoch CIFAR-10 recipes, tried end to
end on the CPU (WHITTLE_GPU160_DEVICE=cpu) in a copy of the parts of the repository it uses, with
the recipes cut to one epoch of 256 images:

- `pack` puts whittle with the libraries it needs beyond LibTorch and glibc, and the archive, into
  .gpu160/; `run` unpacks it, trains both recipes and writes OUT/<recipe>.tar, .log and gpu.txt;
  `record` keeps a finished run's model.h5, metrics.jsonl, recipe.yaml and report.json.
- A later call carries on from the state it is given (`pack BUILD STATE`, STATE a folder of
  <recipe>/ as `record` writes them): an unfinished run (its train_state.pt, metrics.jsonl and
  recipe.yaml) resumes with `--resume` under the same fixed paths and finishes; a finished one is
  not trained again.
- `record` does not replace a recorded run with an archive of fewer epochs (exit status 1).
- Bad input: `run` without a pack, a SECONDS that is not a number or above 540, `record` of a
  folder without archives: exit status 2 and a message naming what is wrong. (`record` of bad
  archives or into a DEST that is a file: scripts_bad_input_test.py, which needs no archive.)

What stops a run at the time limit is `timeout` sending SIGTERM, on which whittle saves its state
(trainer tests); this test does not time it. It runs with this machine's libraries visible, so it
does not show that the packed ones are all a bare machine needs (`run` stops with exit status 2,
listing what is missing, when they are not).
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile

from cli_harness import BIN, SRC, check, finish, out_dir

ARCHIVE = os.path.join(SRC, "..", "shared", "data", "cifar10-jpeg", "cifar10-jpeg.tar.gz")
if not os.path.exists(ARCHIVE):
    print(f"skipping: no CIFAR-10 archive at {ARCHIVE}")
    finish()

work = out_dir("gpu_cifar160")
shutil.rmtree(work, ignore_errors=True)
root = os.path.join(work, "repo")  # the script's ../shared/data/... is work/shared/data/...
os.makedirs(os.path.join(root, "scripts"))
os.makedirs(os.path.join(root, "recipes", "cifar10"))
os.makedirs(os.path.join(work, "shared", "data", "cifar10-jpeg"))
os.symlink(os.path.abspath(ARCHIVE), os.path.join(work, "shared", "data", "cifar10-jpeg", "cifar10-jpeg.tar.gz"))
shutil.copy(os.path.join(SRC, "scripts", "gpu_cifar160.sh"), os.path.join(root, "scripts"))
for stem in ("resnet20", "resnet20_dorefa_w2a2"):
    shutil.copy(os.path.join(SRC, "recipes", "cifar10", stem + ".yaml"), os.path.join(root, "recipes", "cifar10"))
script = os.path.join(root, "scripts", "gpu_cifar160.sh")
build = os.path.dirname(BIN)
env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           WHITTLE_GPU160_DEVICE="cpu",
           WHITTLE_GPU160_SET=f"data.train_limit=256 data.test_limit=200 training.epochs=1 data.batch_size=64 "
                              f"data.pack_to={out_dir('cifar10_cache')}")  # shared with cifar10_budget_results


def sh(*args):
    return subprocess.run(["bash", script, *args], cwd=root, env=env, capture_output=True, text=True)


# Bad input first: nothing packed yet.
r = sh("run", os.path.join(work, "out0"))
check(r.returncode == 2 and ".gpu160/whittle.tar.xz is missing" in r.stderr, f"run without pack: exit 2, says so ({r.stderr.strip()})")
r = sh("run", os.path.join(work, "out0"), "ten")
check(r.returncode == 2 and "'ten'" in r.stderr, f"SECONDS not a number: exit 2 ({r.stderr.strip()})")
r = sh("run", os.path.join(work, "out0"), "600")
check(r.returncode == 2 and "at most 540" in r.stderr, f"SECONDS above 540: exit 2 ({r.stderr.strip()})")
os.makedirs(os.path.join(work, "empty"))
r = sh("record", os.path.join(work, "empty"), os.path.join(work, "rec0"))
check(r.returncode == 2 and "holds no <recipe>.tar" in r.stderr and not os.path.exists(os.path.join(work, "rec0")),
      f"record of a folder without archives: exit 2, nothing written ({r.stderr.strip()})")

r = sh("pack", build)
check(r.returncode == 0, f"pack exits 0 ({r.stderr.strip()[-300:]})")
packed = os.path.join(root, ".gpu160", "whittle.tar.xz")
if check(os.path.exists(packed), "pack wrote .gpu160/whittle.tar.xz"):
    with tarfile.open(packed) as t:
        names = {os.path.basename(n) for n in t.getnames()}
    check("whittle" in names and any(n.startswith("libhdf5") for n in names)
          and not any(n.startswith(("libc.so", "libstdc++", "libtorch")) for n in names),
          f"the binary and HDF5 packed, glibc, the C++ runtime and LibTorch not ({len(names)} files)")

out1 = os.path.join(work, "out1")
r = sh("run", out1, "540")
check(r.returncode == 0, f"run exits 0 ({r.stdout.strip()} {r.stderr.strip()[-300:]})")
for stem in ("resnet20", "resnet20_dorefa_w2a2"):
    check(f"{stem}: finished" in r.stdout, f"{stem} finished")
    check(os.path.exists(os.path.join(out1, stem + ".tar")) and os.path.exists(os.path.join(out1, stem + ".log")),
          f"{stem}.tar and {stem}.log written")
check(open(os.path.join(out1, "gpu.txt")).read().strip() == "device cpu", "gpu.txt names the device")

rec = os.path.join(work, "rec1")
r = sh("record", out1, rec)
check(r.returncode == 0, f"record exits 0 ({r.stderr.strip()})")
for stem in ("resnet20", "resnet20_dorefa_w2a2"):
    d = os.path.join(rec, stem)
    have = sorted(os.listdir(d)) if os.path.isdir(d) else []
    check(have == ["metrics.jsonl", "model.h5", "recipe.yaml", "report.json"], f"{stem}: a finished run's four files kept ({have})")
    if have:
        rep = json.load(open(os.path.join(d, "report.json")))
        lines = open(os.path.join(d, "metrics.jsonl")).read().splitlines()
        check(rep["test_images"] == 200 and len(lines) == 1 and rep["device"] == "cpu",
              f"{stem}: one epoch, 200 test images, on the cpu ({rep['test_images']}, {len(lines)}, {rep['device']})")
        check(f"{stem}: finished, epoch 1" in r.stdout, f"record says where {stem} stands")

# A later sitting: FP32 as `record` keeps an unfinished run (its state after epoch 1 of 1, no
# report yet), W2A2 as it keeps a finished one.
state = os.path.join(work, "state")
unfinished = os.path.join(state, "resnet20")
os.makedirs(unfinished)
with tarfile.open(os.path.join(out1, "resnet20.tar")) as t:
    for name in ("train_state.pt", "metrics.jsonl", "recipe.yaml"):
        with open(os.path.join(unfinished, name), "wb") as f:
            f.write(t.extractfile("./" + name).read())
shutil.copytree(os.path.join(rec, "resnet20_dorefa_w2a2"), os.path.join(state, "resnet20_dorefa_w2a2"))
r = sh("pack", build, state)
check(r.returncode == 0 and sorted(os.listdir(os.path.join(root, ".gpu160", "state"))) == ["resnet20.tar", "resnet20_dorefa_w2a2.tar"],
      f"pack carries both runs on ({r.stdout.strip()} {r.stderr.strip()[-200:]})")
out2 = os.path.join(work, "out2")
r = sh("run", out2, "540")
log = open(os.path.join(out2, "resnet20.log")).read() if os.path.exists(os.path.join(out2, "resnet20.log")) else ""
check(r.returncode == 0 and "resnet20: carrying on after epoch 1" in r.stdout and "resuming" in log and "resnet20: finished" in r.stdout,
      f"the unfinished run resumes and finishes ({r.stdout.strip()})")
check("resnet20_dorefa_w2a2: finished in an earlier call" in r.stdout, "the finished run is not trained again")
with tarfile.open(os.path.join(out2, "resnet20.tar")) as t:
    rep = json.load(t.extractfile("./report.json"))
    lines = t.extractfile("./metrics.jsonl").read().decode().splitlines()
check(len(lines) == 1 and rep["epochs"] == 1 and rep["test_images"] == 200,
      f"the resumed run's report: 1 epoch, 200 test images ({rep['epochs']}, {rep['test_images']})")
check(os.path.exists(os.path.join(out2, "resnet20_dorefa_w2a2.tar")), "the finished run goes back too")

# record keeps the run recorded further along.
fewer = os.path.join(work, "fewer")
os.makedirs(os.path.join(fewer, "x"))
open(os.path.join(fewer, "x", "train_state.pt"), "wb").write(b"state")
open(os.path.join(fewer, "x", "metrics.jsonl"), "w").close()
with tarfile.open(os.path.join(fewer, "resnet20.tar"), "w") as t:
    for name in ("train_state.pt", "metrics.jsonl"):
        t.add(os.path.join(fewer, "x", name), arcname="./" + name)
shutil.rmtree(os.path.join(fewer, "x"))
r = sh("record", fewer, rec)
check(r.returncode == 1 and "not replaced" in r.stderr and os.path.exists(os.path.join(rec, "resnet20", "report.json")),
      f"record does not replace 1 recorded epoch with 0 ({r.stderr.strip()})")
finish()
