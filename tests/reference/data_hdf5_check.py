"""Checks whittle's HDF5 dataset layout against h5py in both directions.

1. Writes dataset files with h5py (class names as a root attribute of variable-length UTF-8
   strings; class names as a fixed-length byte-string dataset with int32 labels; a file claiming
   format_version 2, which whittle must refuse).
2. Runs data_test's DataHdf5Python case, which reads them with whittle, checks every value, and
   writes whittle.h5 and whittle_gzip.h5.
3. Reads whittle's files with h5py and checks dtypes, shapes, values, attributes and that no
   temporary file was left behind.
4. Checks whittle's image decoding against PIL: an image folder of JPEGs (4:2:0 colour, gray) and
   PNGs (RGBA, palette, 16-bit RGB, gray) written with PIL is packed by whittle (in step 2) and
   must equal PIL's Image.open(f).convert("RGB") exactly.

Usage: data_hdf5_check.py <path to data_test>
Pattern shared with the C++ side: images [5, 3, 4, 6] with flat element k = (37*k + 11) % 256,
labels [2, 0, 1, 2, 1], class names cat, dog, "ünï".
"""

import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
from PIL import Image

NAMES = ["cat", "dog", "\u00fcn\u00ef"]


def expected_images():
    return ((np.arange(5 * 3 * 4 * 6, dtype=np.int64) * 37 + 11) % 256).astype(np.uint8).reshape(5, 3, 4, 6)


def expected_labels():
    return np.array([2, 0, 1, 2, 1], dtype=np.int64)


def write_pil_folder(root):
    """Writes root/<class>/<file> with PIL; returns {relative path: PIL's RGB decode}."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:16, 0:16]
    smooth = np.stack([xx * 15, yy * 15, (xx + yy) * 7], axis=-1).astype(np.uint8)
    noisy = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    images = {
        "a/0_color420.jpg": (Image.fromarray(smooth), dict(quality=90, subsampling=2)),
        "a/1_noisy444.jpg": (Image.fromarray(noisy), dict(quality=75, subsampling=0)),
        "a/2_gray.jpg": (Image.fromarray(smooth[:, :, 0]), dict(quality=85)),
        "b/0_rgba.png": (Image.fromarray(np.dstack([noisy, smooth[:, :, :1]])), {}),
        "b/1_palette.png": (Image.fromarray(noisy).quantize(colors=16), {}),
        "b/2_gray.png": (Image.fromarray(noisy[:, :, 1]), {}),
    }
    decoded = {}
    for rel, (image, options) in images.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        image.save(path, **options)
        with Image.open(path) as f:
            decoded[rel] = np.asarray(f.convert("RGB")).transpose(2, 0, 1)
    # 16-bit RGB PNG (PIL cannot write one): written with raw zlib; PIL decodes it to the high bytes.
    wide = rng.integers(0, 65536, (16, 16, 3), dtype=np.uint16)
    path = os.path.join(root, "b/3_rgb16.png")
    write_png16(path, wide)
    with Image.open(path) as f:
        decoded["b/3_rgb16.png"] = np.asarray(f.convert("RGB")).transpose(2, 0, 1)
    if not np.array_equal(decoded["b/3_rgb16.png"], (wide >> 8).astype(np.uint8).transpose(2, 0, 1)):
        fail("PIL's 16-bit PNG decode is not the high byte (the check's assumption)")
    return decoded


def write_png16(path, rgb16):
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    h, w, _ = rgb16.shape
    raw = b"".join(b"\x00" + rgb16[y].astype(">u2").tobytes() for y in range(h))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw)))
        f.write(chunk(b"IEND", b""))


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def main():
    data_test = sys.argv[1]
    out = os.path.join(os.environ.get("WHITTLE_BINARY_DIR", "."), "testdata", "data_hdf5_h5py")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)

    with h5py.File(os.path.join(out, "from_h5py_attr.h5"), "w") as f:
        f["images"] = expected_images()
        f["labels"] = expected_labels()
        f.attrs["class_names"] = np.array(NAMES, dtype=h5py.string_dtype("utf-8"))
    with h5py.File(os.path.join(out, "from_h5py_fixed.h5"), "w") as f:
        f.create_dataset("images", data=expected_images(), chunks=(2, 3, 4, 6), compression="gzip")
        f["labels"] = expected_labels().astype(np.int32)
        f["class_names"] = np.array([n.encode("utf-8") for n in NAMES], dtype="S12")

    with h5py.File(os.path.join(out, "future.h5"), "w") as f:
        f["images"] = expected_images()
        f["labels"] = expected_labels()
        f.attrs["format_version"] = np.int64(2)

    pil = write_pil_folder(os.path.join(out, "pil_folder"))

    env = dict(os.environ, WHITTLE_DATA_H5PY_DIR=out)
    run = subprocess.run([data_test, "--gtest_filter=DataHdf5Python.*"], env=env, capture_output=True, text=True)
    print(run.stdout[-4000:], run.stderr[-4000:])
    if run.returncode != 0:
        fail("data_test DataHdf5Python failed")
    if "[  SKIPPED ]" in run.stdout or "1 test from" not in run.stdout:
        fail("data_test DataHdf5Python did not run")

    for name, compression in [("whittle.h5", None), ("whittle_gzip.h5", "gzip")]:
        path = os.path.join(out, name)
        with h5py.File(path, "r") as f:
            images, labels = f["images"], f["labels"]
            if images.dtype != np.uint8 or images.shape != (5, 3, 4, 6):
                fail(f"{name}: images {images.dtype} {images.shape}, expected uint8 (5, 3, 4, 6)")
            if labels.dtype != np.int64 or labels.shape != (5,):
                fail(f"{name}: labels {labels.dtype} {labels.shape}, expected int64 (5,)")
            if not np.array_equal(images[()], expected_images()):
                fail(f"{name}: image values differ")
            if not np.array_equal(labels[()], expected_labels()):
                fail(f"{name}: label values differ")
            if images.compression != compression:
                fail(f"{name}: compression {images.compression}, expected {compression}")
            names = [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in f.attrs["class_names"]]
            if names != NAMES:
                fail(f"{name}: class_names {names}, expected {NAMES}")
            fmt = f.attrs["format"]
            fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
            if fmt != "whittle.dataset" or int(f.attrs["format_version"]) != 1:
                fail(f"{name}: format/format_version attributes {fmt!r}/{f.attrs['format_version']!r}")
    with h5py.File(os.path.join(out, "pil_folder.h5"), "r") as f:
        images, labels = f["images"][()], f["labels"][()]
    names = sorted(pil)
    if images.shape != (len(names), 3, 16, 16):
        fail(f"pil_folder.h5: images shape {images.shape}, expected {(len(names), 3, 16, 16)}")
    if list(labels) != [0 if n.startswith("a/") else 1 for n in names]:
        fail(f"pil_folder.h5: labels {list(labels)}")
    for i, name in enumerate(names):
        if not np.array_equal(images[i], pil[name]):
            diff = np.abs(images[i].astype(int) - pil[name].astype(int)).max()
            fail(f"{name}: whittle's decode differs from PIL's (max |diff| {diff})")
    print(f"OK: {len(names)} JPEG/PNG images decode exactly as PIL does")

    leftovers = sorted(n for n in os.listdir(out) if ".tmp" in n)
    if leftovers:
        fail(f"temporary files left behind: {leftovers}")
    print("OK: whittle and h5py agree on the HDF5 dataset layout")


if __name__ == "__main__":
    main()
