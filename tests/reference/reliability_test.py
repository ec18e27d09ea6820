"""Bad input, named: one case per class of bad input (truncated, bit-flipped, wrong magic, wrong
dtype or shape, huge declared sizes, NaN/Inf weights, wrong recipe types, unknown ops, mismatched
shapes, unwritable paths, a full disk) for each kind of file whittle reads. Each case runs the
program on the bad input and checks its exit code, its one-line message, that no backtrace is
printed and that nothing is written or replaced; and docs/reliability.md's table must be the one
this test observes (`reliability_test.py --print-table` prints it).

Usage: reliability_test.py KILL_SHIM_SO [--print-table] (WHITTLE_BIN, WHITTLE_SOURCE_DIR,
WHITTLE_BINARY_DIR set; the shim library fails writes with ENOSPC for the full-disk case).
"""
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import zlib

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_harness import BIN, MNIST, SRC, check, failures, finish, out_dir  # noqa: E402

SHIM = os.path.abspath(sys.argv[1])
PRINT = "--print-table" in sys.argv
W = out_dir("reliability")
shutil.rmtree(W, ignore_errors=True)
os.makedirs(W)
DOC = os.path.join(SRC, "docs", "reliability.md")


def whittle(*args, env=None, stdout=subprocess.PIPE):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([BIN, *args], stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=W, env=e)


def write(name, data):
    with open(os.path.join(W, name), "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return name


# A real checkpoint to damage: LeNet-5 FP32 after one short epoch.
write("good.yaml", f"""model: {{name: lenet5}}
data: {{train: {MNIST}, test: {MNIST}, test_split: t10k, batch_size: 32, train_limit: 64, test_limit: 64}}
training: {{epochs: 1, optimizer: {{name: sgd, lr: 0.01}}, threads: 1}}
outputs: {{dir: good}}
""")
r = whittle("run", "good.yaml")
if not check(r.returncode == 0, "the checkpoint to damage is written" + ("" if r.returncode == 0 else ": " + r.stderr[-800:])):
    finish()
GOOD = open(os.path.join(W, "good", "model.h5"), "rb").read()


def edited(name, edit):
    """A copy of the good checkpoint with `edit(h5py.File)` applied."""
    write(name, GOOD)
    with h5py.File(os.path.join(W, name), "r+") as f:
        edit(f)
    return name


PACKED = open(os.path.join(SRC, "tests", "fixtures", "lenet5_lsq_w3_packed4.h5"), "rb").read()


def edited_packed(name, edit):
    """A copy of a packed checkpoint (LeNet-5 LSQ W3A3, format version 3) with `edit(h5py.File)` applied."""
    write(name, PACKED)
    with h5py.File(os.path.join(W, name), "r+") as f:
        edit(f)
    return name


def narrower_packing(f, index):
    entry(index, "fc1", "weight_codes")["packed"]["packed_bits"] = 2


def packing_removed(f, index):
    del entry(index, "conv2", "weight_codes")["packed"]


def set_text(f, key, text):
    """Replaces the deflated uint8 text dataset `key` (with its crc32 attribute, as whittle writes it)."""
    data = text.encode()
    del f[key]
    ds = f.create_dataset(key, data=np.frombuffer(data, np.uint8), compression="gzip")
    ds.attrs["crc32"] = np.int64(zlib.crc32(data))


def edit_index(fn):
    def edit(f):
        index = json.loads(bytes(f["tensors/index"][()]).rstrip(b"\0"))
        fn(f, index)
        set_text(f, "tensors/index", json.dumps(index))
    return edit


def edit_graph(fn):
    def edit(f):
        graph = json.loads(bytes(f["graph"][()]).rstrip(b"\0"))
        fn(graph)
        set_text(f, "graph", json.dumps(graph))
    return edit


def entry(index, node, name):
    return next(e for e in index if e["node"] == node and e["name"] == name)


def flip_tensor_byte(f):
    data = f["tensors/data"]
    off = data.id.get_offset()
    f.flush()
    return off


def nan_weights(f, index):
    e = entry(index, "conv1", "weight")
    data = f["tensors/data"][()]
    values = np.full(e["nbytes"] // 4, np.nan, np.float32).tobytes()
    data[e["offset"]:e["offset"] + e["nbytes"]] = np.frombuffer(values, np.uint8)
    f["tensors/data"][...] = data
    e["crc32"] = zlib.crc32(values)


def wrong_dtype(f, index):
    entry(index, "conv1", "weight")["dtype"] = "int32"


def huge(f, index):
    entry(index, "fc3", "weight")["nbytes"] = 1 << 40


def duplicated_entry(f, index):
    """fc3.bias indexed twice, the second entry at the first 40 bytes of conv1's weight."""
    twin = dict(entry(index, "fc3", "bias"))
    twin["offset"] = entry(index, "conv1", "weight")["offset"]
    data = bytes(f["tensors/data"][twin["offset"]:twin["offset"] + twin["nbytes"]])
    twin["crc32"] = zlib.crc32(data)
    index.append(twin)


def stray_entry(f, index):
    ghost = dict(entry(index, "fc3", "bias"))
    ghost["node"] = "fc9"
    index.append(ghost)


def wrong_shape(graph):
    node = next(n for n in graph["nodes"] if n["name"] == "conv1")
    node["params"][0]["shape"] = [6, 1, 3, 3]


def huge_input(graph):
    graph["inputs"][0]["shape"] = [1, 1, 2**40, 2**40]


def wrapping_input(graph):
    """H = W = 2^61 + 28: LeNet-5's flatten used to wrap to exactly 400 features."""
    graph["inputs"][0]["shape"] = [1, 1, 2**61 + 28, 2**61 + 28]


def unknown_op(graph):
    graph["nodes"][0]["op"] = "conv9d"


def graph_node(graph, name):
    return next(n for n in graph["nodes"] if n["name"] == name)


def zero_stride(graph):
    graph_node(graph, "conv1")["attrs"]["stride"] = {"type": "ints", "value": [0, 1]}


def misspelt_attribute(graph):
    graph_node(graph, "conv1")["attrs"]["strides"] = {"type": "ints", "value": [1, 1]}


def sign_of_64_bits(graph):
    """relu1 made a sign binarizer (act_quant, method sign) with activation_bits 64."""
    n = graph_node(graph, "relu1")
    n["op"] = "act_quant"
    n["attrs"] = {"method": {"type": "string", "value": "sign"}, "activation_bits": {"type": "int", "value": 64}}


def unknown_quantizer(graph):
    n = graph_node(graph, "relu1")
    n["op"] = "act_quant"
    n["attrs"] = {"method": {"type": "string", "value": "lsq9"}, "activation_bits": {"type": "int", "value": 4}}


def twice_masked(graph):
    graph_node(graph, "conv1")["weight_transforms"] = ["mask", "mask"]


# Bit flips at fixed places of the good file: one in a tensor's bytes, one in HDF5's metadata.
with h5py.File(os.path.join(W, "good", "model.h5"), "r") as f:
    DATA_AT = f["tensors/data"].id.get_offset()


def flipped(name, at):
    b = bytearray(GOOD)
    b[at] ^= 0x10
    return write(name, bytes(b))


# IDX, CIFAR-10 and HDF5 datasets (through `whittle data pack`), image archives.
raw_images = gzip.open(os.path.join(MNIST, "t10k-images-idx3-ubyte.gz")).read()[:16 + 8 * 784]
raw_labels = gzip.open(os.path.join(MNIST, "t10k-labels-idx1-ubyte.gz")).read()[:8 + 8]


def idx_dir(name, images, labels=None):
    d = os.path.join(W, name)
    os.makedirs(d, exist_ok=True)
    images = bytearray(images)
    with open(os.path.join(d, "train-images-idx3-ubyte"), "wb") as f:
        f.write(bytes(images))
    lab = bytearray(labels if labels is not None else raw_labels)
    with open(os.path.join(d, "train-labels-idx1-ubyte"), "wb") as f:
        f.write(bytes(lab))
    return name


def with_count(images, n):
    b = bytearray(images)
    b[4:8] = n.to_bytes(4, "big")
    return bytes(b)


def h5_dataset(name, images, labels):
    with h5py.File(os.path.join(W, name), "w") as f:
        f["images"] = images
        f["labels"] = labels
        f.attrs["format"] = "whittle.dataset"
    return name


def huge_h5(name):
    """/images declared as 10^9 RGB 32×32 images in chunks, none written: a small file."""
    with h5py.File(os.path.join(W, name), "w") as f:
        f.create_dataset("images", shape=(10**9, 3, 32, 32), dtype=np.uint8, chunks=(1, 3, 32, 32))
        f.create_dataset("labels", shape=(10**9,), dtype=np.int64, chunks=(1024,))
    return name


r = whittle("data", "pack", idx_dir("digits", with_count(raw_images, 8), with_count(raw_labels, 8)), "--to", "digits.h5")
check(r.returncode == 0, "a good HDF5 dataset is packed" + ("" if r.returncode == 0 else ": " + r.stderr[-500:]))

os.makedirs(os.path.join(W, "ro_parent"), exist_ok=True)
write("not_a_dir", "a file\n")

# (class, what the input is, command, expected exit code). Messages are what the program prints.
CASES = [
    ("truncated", "checkpoint cut to half its bytes", ["inspect", write("half.h5", GOOD[:len(GOOD) // 2])], 1),
    ("bit-flipped", "one bit of a tensor's bytes", ["inspect", flipped("flip_data.h5", DATA_AT + 100)], 1),
    ("bit-flipped", "one bit of HDF5's metadata (object header)", ["inspect", flipped("flip_meta.h5", 200)], 1),
    ("wrong magic", "a text file named model.h5", ["inspect", write("text.h5", "not a model\n")], 1),
    ("wrong magic", "an HDF5 file that is not a checkpoint", ["inspect", "digits.h5"], 1),
    ("wrong dtype", "index says int32 for a float32 weight", ["inspect", edited("dtype.h5", edit_index(wrong_dtype))], 1),
    ("wrong shape", "graph says [6, 1, 3, 3] for conv1's [6, 1, 5, 5] weight", ["inspect", edited("shape.h5", edit_graph(wrong_shape))], 1),
    ("inconsistent index", "fc3.bias indexed twice, the second at other bytes (CRC-32 right)", ["inspect", edited("twice.h5", edit_index(duplicated_entry))], 1),
    ("inconsistent index", "fc1's 3-bit codes declared as packed at 2 bits (CRC-32 right)", ["inspect", edited_packed("packed2.h5", edit_index(narrower_packing))], 1),
    ("inconsistent index", "conv2's packed codes without their packing entry", ["inspect", edited_packed("unpacked.h5", edit_index(packing_removed))], 1),
    ("inconsistent index", "an index entry for a node 'fc9' the graph does not have", ["eval", edited("stray.h5", edit_index(stray_entry))], 1),
    ("huge declared size", "index declares a 1 TiB tensor", ["inspect", edited("huge.h5", edit_index(huge))], 1),
    ("NaN/Inf weights", "conv1's weight all NaN, CRC-32 updated", ["eval", edited("nan.h5", edit_index(nan_weights))], 1),
    ("huge declared size", "graph input declared [1, 1, 2^40, 2^40]", ["inspect", edited("huge_input.h5", edit_graph(huge_input))], 1),
    ("huge declared size", "graph input H = W = 2^61 + 28 (wraps to LeNet-5's 400 features)", ["prune", edited("wrap_input.h5", edit_graph(wrapping_input)), "--target-macs", "0.5", "--out", "never.h5"], 1),
    ("unknown op", "graph names op 'conv9d'", ["inspect", edited("op.h5", edit_graph(unknown_op))], 1),
    ("attribute out of range", "conv1's stride [0, 1]", ["inspect", edited("stride.h5", edit_graph(zero_stride))], 1),
    ("attribute out of range", "conv1 gets an undeclared attribute 'strides'", ["inspect", edited("strides.h5", edit_graph(misspelt_attribute))], 1),
    ("attribute out of range", "a sign binarizer with activation_bits 64", ["inspect", edited("sign64.h5", edit_graph(sign_of_64_bits))], 1),
    ("attribute out of range", "an act_quant of method 'lsq9'", ["inspect", edited("lsq9.h5", edit_graph(unknown_quantizer))], 1),
    ("attribute out of range", "conv1's weight transform stack [mask, mask]", ["inspect", edited("mask2.h5", edit_graph(twice_masked))], 1),
    ("newer format", "format_version 99", ["inspect", edited("v99.h5", lambda f: f.attrs.__setitem__("format_version", 99))], 1),
    ("truncated", "IDX image file cut inside its 8th image", ["data", "pack", idx_dir("idx_cut", with_count(raw_images, 8)[:16 + 7 * 784 + 100], with_count(raw_labels, 8)), "--to", "out.h5"], 1),
    ("wrong magic", "IDX file with magic 0x0000 0900", ["data", "pack", idx_dir("idx_magic", b"\0\0\x09\0" + raw_images[4:], with_count(raw_labels, 8)), "--to", "out.h5"], 1),
    ("huge declared size", "IDX header declares 2,147,483,647 images", ["data", "pack", idx_dir("idx_huge", with_count(raw_images, 2**31 - 1), with_count(raw_labels, 8)), "--to", "out.h5"], 1),
    ("mismatched shapes", "IDX labels for 7 of 8 images", ["data", "pack", idx_dir("idx_count", with_count(raw_images, 8), with_count(raw_labels, 7)[:15]), "--to", "out.h5"], 1),
    ("wrong dtype", "HDF5 dataset with float32 images", ["data", "pack", h5_dataset("float.h5", np.zeros((2, 1, 4, 4), np.float32), np.zeros(2, np.int64)), "--to", "out.h5"], 1),
    ("huge declared size", "HDF5 dataset declaring 10^9 images, none stored", ["data", "pack", huge_h5("huge_images.h5"), "--to", "out.h5"], 1),
    ("mismatched shapes", "HDF5 dataset with 2 images and 3 labels", ["data", "pack", h5_dataset("labels.h5", np.zeros((2, 1, 4, 4), np.uint8), np.zeros(3, np.int64)), "--to", "out.h5"], 1),
    ("wrong recipe type", "training.epochs: ten", ["run", write("type.yaml", open(os.path.join(W, "good.yaml")).read().replace("epochs: 1", "epochs: ten"))], 2),
    ("wrong recipe type", "--set training.epochs=[1, 2]", ["run", "good.yaml", "--set", "training.epochs=[1, 2]", "--out", "never"], 2),
    ("unknown key", "training.epoch (for epochs)", ["run", write("key.yaml", open(os.path.join(W, "good.yaml")).read().replace("epochs: 1", "epoch: 1"))], 2),
    ("mismatched shapes", "a LeNet-5 checkpoint (1×28×28) trained on 3×32×32 images", ["run", write("shape.yaml", open(os.path.join(W, "good.yaml")).read().replace("model: {name: lenet5}", "model: {file: good/model.h5}").replace(f"train: {MNIST}", "train: rgb.h5").replace(f"test: {MNIST}", "test: rgb.h5").replace(", test_split: t10k", "").replace("outputs: {dir: good}", "outputs: {dir: never}"))], 2),
    ("unwritable path", "--out below a regular file", ["run", "good.yaml", "--out", "not_a_dir/run"], 1),
    ("full disk", "every write to the run directory fails with ENOSPC", ["run", "good.yaml", "--out", "full_disk"], 1),
    ("full standard output", "the JSON result written to /dev/full", ["eval", "good/model.h5", "--json"], 1),
    ("existing output", "data pack onto a trained checkpoint (no --overwrite)", ["data", "pack", "digits", "--to", "good/model.h5"], 2),
    ("conflicting recipe", "two quantize entries on the same layers", ["run", write("two_quantize.yaml", open(os.path.join(W, "good.yaml")).read().replace("outputs: {dir: good}", "outputs: {dir: never}") + "modifiers:\n  - {name: quantize, method: dorefa, weight_bits: 2}\n  - {name: quantize, method: dorefa, weight_bits: 4, start_epoch: 0.5}\n")], 2),
    ("conflicting recipe", "nesterov: true with momentum 0", ["run", "good.yaml", "--set", "training.optimizer.nesterov=true", "--set", "training.optimizer.momentum=0", "--out", "never"], 2),
]
h5_dataset("rgb.h5", np.zeros((64, 3, 32, 32), np.uint8), np.zeros(64, np.int64))

rows = []
for klass, what, args, code in CASES:
    env = {"LD_PRELOAD": SHIM, "WHITTLE_ENOSPC": "/full_disk/"} if klass == "full disk" else None
    before = sorted(os.listdir(W))
    if klass == "full standard output":
        with open("/dev/full", "w") as full:
            r = whittle(*args, stdout=full)
    else:
        r = whittle(*args, env=env)
    err = r.stderr.strip()
    last = err.splitlines()[-1] if err else ""
    message = re.sub(r"^whittle( \w+)?: error: ", "", last)
    after = sorted(os.listdir(W))
    created = [n for n in after if n not in before]
    clean = r.returncode == code and message and "Exception raised from" not in err and "frame #" not in err \
        and "terminate called" not in err
    check(clean, f"{klass}: {what}: exit {r.returncode} (want {code}): {message}")
    check(not created or created == ["full_disk"] and not os.listdir(os.path.join(W, "full_disk")),
          f"{klass}: {what}: nothing written ({created})")
    rows.append(f"| {klass} | {what} | `whittle {' '.join(args)}` | {r.returncode} | {message} |")
check(open(os.path.join(W, "good", "model.h5"), "rb").read() == GOOD, "the good checkpoint is untouched")



def real_full_disk():
    """A real full file system (a small tmpfs, mounted when this runs as root, as CI does): the
    second epoch's checkpoint cannot be written. Exit 1 naming the lack of space, no backtrace, no
    temporary left, and the first epoch's training state kept and resumable; exports to the full
    file system likewise."""
    if os.geteuid() != 0:
        print("skip the real full disk: mounting a tmpfs needs root")
        return
    mnt = os.path.join(W, "tmpfs")
    os.makedirs(mnt)
    model = len(GOOD)
    state = os.path.getsize(os.path.join(W, "good", "train_state.pt"))
    # Room for the first epoch's files and half a checkpoint more: the second epoch's checkpoint
    # fills it.
    size_kb = (model + state + model // 2) // 1024
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", mnt], capture_output=True, text=True)
    if m.returncode != 0 and "permission denied" in m.stderr.lower():
        print(f"skip the real full disk: root here may not mount ({m.stderr.strip()})")
        return
    if not check(m.returncode == 0, f"a {size_kb} kB tmpfs is mounted at {mnt} ({m.stderr.strip()})"):
        return
    try:
        run = os.path.join(mnt, "run")

        def refused(r, what):
            err = r.stderr.strip()
            clean = r.returncode == 1 and re.search("no space left", err, re.I) is not None and \
                "frame #" not in err and "terminate called" not in err and "Exception raised" not in err
            check(clean, f"real full disk: {what}: exit {r.returncode} (want 1), says no space left: {err[-300:]}")
            stray = [n for d, _, names in os.walk(mnt) for n in names if ".tmp-" in n]
            check(not stray, f"real full disk: {what}: no temporary file left ({stray})")

        refused(whittle("run", "good.yaml", "--set", "training.epochs=3", "--out", run), "whittle run, epoch 2's checkpoint")
        check(os.path.exists(os.path.join(run, "train_state.pt")), "real full disk: epoch 1's training state is kept")
        r = whittle("run", "good.yaml", "--set", "training.epochs=3", "--out", run, "--resume")
        check("resuming" in r.stdout and "epoch 2" in r.stdout, f"real full disk: --resume goes on from epoch 1's state ({r.stdout[-200:]})")
        refused(r, "whittle run --resume, again at epoch 2's checkpoint")
        for ext in ("pt", "onnx"):
            refused(whittle("export", "good/model.h5", "--out", os.path.join(mnt, "m." + ext)), f"whittle export to .{ext}")
        refused(whittle("fuse", "good/model.h5", "--out", os.path.join(mnt, "f.h5")), "whittle fuse")
    finally:
        subprocess.run(["umount", mnt], check=False)


real_full_disk()

table = "\n".join(["| class | input | command | exit | message |", "|---|---|---|---:|---|"] + rows)
if PRINT:
    print(table)
else:
    doc = open(DOC).read()
    m = re.search(r"<!-- bad-input table: begin.*?-->\n(.*?)\n<!-- bad-input table: end -->", doc, re.S)
    check(m is not None and m.group(1).strip() == table,
          "docs/reliability.md's bad-input table is the one observed (reliability_test.py --print-table prints it)")
finish()
