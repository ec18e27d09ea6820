"""scripts/gpu_cifar160.sh, the prepared GPU run of the 160-epoch CIFAR-10 recipes, tried end to
end on the CPU (WHITTLE_GPU160_DEVICE=cpu) in a copy of the parts of the repository it uses, with
the recipes cut to one epoch of 256 images:

- `pack` puts whittle with the libraries it needs beyond LibTorch and glibc, and the archive, into
  .gpu160/; `run` unpacks it, trains both recipes and writes OUT/<recipe>.tar, .log and gpu.txt;
  `record` keeps a finished run's model.h5, metrics.jsonl, recipe.yaml and report.json.
- A second call given the first call's archives (`pack BUILD STATE`) trains nothing again.
- Bad input: `run` without a pack, a SECONDS that is not a number, `record` of a folder without
  archives: exit status 2 and a message naming what is wrong.

Stopping at the time limit and resuming is whittle's `--resume` (trainer tests); this test does not
time it.
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
                              f"data.pack_to={os.path.join(work, 'cache')}")


def sh(*args):
    return subprocess.run(["bash", script, *args], cwd=root, env=env, capture_output=True, text=True)


# Bad input first: nothing packed yet.
r = sh("run", os.path.join(work, "out0"))
check(r.returncode == 2 and ".gpu160/whittle.tar.xz is missing" in r.stderr, f"run without pack: exit 2, says so ({r.stderr.strip()})")
r = sh("run", os.path.join(work, "out0"), "ten")
check(r.returncode == 2 and "'ten'" in r.stderr, f"SECONDS not a number: exit 2 ({r.stderr.strip()})")
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
r = sh("run", out1, "600")
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

# The next call, given the archives back: nothing is trained again.
r = sh("pack", build, out1)
check(r.returncode == 0 and os.path.exists(os.path.join(root, ".gpu160", "state", "resnet20.tar")), "pack with the state")
r = sh("run", os.path.join(work, "out2"), "600")
check(r.returncode == 0 and r.stdout.count("finished in an earlier call") == 2, f"finished runs are not trained again ({r.stdout.strip()})")
finish()
