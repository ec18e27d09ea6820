"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from real files of the
project: checkpoints and graph structures of short LeNet-5 runs (FP32 cut to a few images' worth of
steps, DoReFa W2A2, BNN: packed and float tensors), the shipped recipes, the first MNIST digits as
IDX files (plain and gzip), CIFAR-10 images from the bundled JPEG archive as a binary batch, an
HDF5 dataset packed by `whittle data pack`, a small image-folder archive and single JPEG/PNG files.
Seeds are kept small (libFuzzer mutates faster on small inputs).

Usage: WHITTLE_BIN=build/whittle .venv/bin/python tests/fuzz/make_seeds.py
"""
import glob
import gzip
import io
import os
import shutil
import subprocess
import tarfile
import tempfile

import h5py
import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("WHITTLE_BIN", os.path.join(SRC, "build", "whittle"))
CORPUS = os.path.join(HERE, "corpus")
MNIST = os.path.join(SRC, "data", "mnist10k")
CIFAR = os.path.join(SRC, "..", "shared", "data", "cifar10-jpeg", "cifar10-jpeg.tar.gz")


def out(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def idx(images_or_labels, n):
    """The first n records of the bundled t10k IDX file, with the count in the header set to n."""
    name = "t10k-images-idx3-ubyte.gz" if images_or_labels == "images" else "t10k-labels-idx1-ubyte.gz"
    raw = gzip.open(os.path.join(MNIST, name)).read()
    dims = raw[3]
    header = bytearray(raw[:4 + 4 * dims])
    header[4:8] = n.to_bytes(4, "big")
    record = int(np.prod([int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(1, dims)] or [1]))
    return bytes(header) + raw[4 + 4 * dims:4 + 4 * dims + n * record]


def cifar_images(n_per_class, classes=("airplane", "cat", "ship")):
    """(class index, class name, file name, JPEG bytes) of the first images of some classes."""
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    found = {c: [] for c in classes}
    with tarfile.open(CIFAR) as tar:
        for m in tar:
            parts = m.name.split("/")
            if m.isfile() and len(parts) >= 3 and parts[-3] == "train" and parts[-2] in found and len(found[parts[-2]]) < n_per_class:
                found[parts[-2]].append((parts[-1], tar.extractfile(m).read()))
            if all(len(v) == n_per_class for v in found.values()):
                break
    return [(names.index(c), c, f, b) for c in classes for f, b in found[c]]


def run_checkpoint(tmp, name, modifiers):
    recipe = os.path.join(tmp, name + ".yaml")
    with open(recipe, "w") as f:
        f.write(f"""model: {{name: lenet5}}
data: {{train: {MNIST}, test: {MNIST}, test_split: t10k, batch_size: 32, train_limit: 64, test_limit: 64}}
training: {{epochs: 1, optimizer: {{name: sgd, lr: 0.01}}, threads: 1}}
{modifiers}
outputs: {{dir: {os.path.join(tmp, name)}}}
""")
    subprocess.run([BIN, "run", recipe], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(tmp, name, "model.h5")


def main():
    shutil.rmtree(CORPUS, ignore_errors=True)
    tmp = tempfile.mkdtemp()
    try:
        # Checkpoints and their graph structures.
        for name, mods in [("w2a2", "modifiers: [{name: quantize, method: dorefa, weight_bits: 2, activation_bits: 2}]"),
                           ("bnn", "modifiers: [{name: quantize, method: bnn}]"),
                           ("twn", "modifiers: [{name: quantize, method: twn, activation_bits: 8}]")]:
            path = run_checkpoint(tmp, name, mods)
            out("checkpoint", name + ".h5", open(path, "rb").read())
            with h5py.File(path, "r") as f:
                out("graph_json", name + ".json", bytes(f["graph"][()]))
        # Recipes: every shipped one, and one with overrides.
        for p in sorted(glob.glob(os.path.join(SRC, "recipes", "**", "*.yaml"), recursive=True)):
            out("recipe", os.path.relpath(p, os.path.join(SRC, "recipes")).replace("/", "_"), open(p, "rb").read())
        lenet = open(os.path.join(SRC, "recipes", "mnist", "lenet5_dorefa_w2a2.yaml"), "rb").read()
        out("recipe", "overrides.yaml", lenet + b"\n#--set\ntraining.epochs=2\nmodifiers.0.weight_bits=4\ndata.batch_size=8\n")
        # IDX.
        out("idx", "images-idx3-ubyte", idx("images", 4))
        out("idx", "labels-idx1-ubyte", idx("labels", 16))
        out("idx", "images-idx3-ubyte.gz", gzip.compress(idx("images", 2), mtime=0))
        # CIFAR-10 binary batch: label byte, then 1024 R, 1024 G, 1024 B bytes per image.
        images = cifar_images(2)
        batch = b""
        for label, _, _, jpeg in images[:3]:
            a = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
            batch += bytes([label]) + a.transpose(2, 0, 1).tobytes()
        out("cifar10", "data_batch_1.bin", batch)
        # Image-folder archive (train/<class>/<file>) and single images.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for i, (_, cls, fname, jpeg) in enumerate(images):
                data = jpeg
                if i == len(images) - 1:  # one PNG among the JPEGs
                    png = io.BytesIO()
                    Image.open(io.BytesIO(jpeg)).save(png, format="PNG")
                    data, fname = png.getvalue(), fname.rsplit(".", 1)[0] + ".png"
                info = tarfile.TarInfo(f"cifar10/train/{cls}/{fname}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
        out("image_archive", "images.tar.gz", buf.getvalue())
        img = Image.open(io.BytesIO(images[0][3]))
        out("image", "color.jpg", images[0][3])
        for mode, name in [("RGB", "color.png"), ("L", "gray.png"), ("P", "palette.png"), ("RGBA", "alpha.png"),
                           ("I;16", "gray16.png")]:
            png = io.BytesIO()
            (img.convert("L").convert(mode) if mode == "I;16" else img.convert(mode)).save(png, format="PNG")
            out("image", name, png.getvalue())
        gray = io.BytesIO()
        img.convert("L").save(gray, format="JPEG", quality=75)
        out("image", "gray.jpg", gray.getvalue())
        # HDF5 dataset: the IDX digits packed by whittle.
        mn = os.path.join(tmp, "mnist")
        os.makedirs(mn)
        with open(os.path.join(mn, "train-images-idx3-ubyte"), "wb") as f:
            f.write(idx("images", 3))
        with open(os.path.join(mn, "train-labels-idx1-ubyte"), "wb") as f:
            lab = bytearray(idx("labels", 3))
            f.write(bytes(lab))
        packed = os.path.join(tmp, "digits.h5")
        subprocess.run([BIN, "data", "pack", mn, "--to", packed], check=True, stdout=subprocess.DEVNULL)
        out("hdf5_dataset", "digits.h5", open(packed, "rb").read())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for t in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, t))
        print(f"{t}: {len(files)} seeds, {sum(os.path.getsize(os.path.join(CORPUS, t, f)) for f in files)} bytes")


if __name__ == "__main__":
    main()
