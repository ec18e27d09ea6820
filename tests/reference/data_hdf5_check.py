"""Checks whittle's HDF5 dataset layout against h5py in both directions.

1. Writes two dataset files with h5py (class names as a root attribute of variable-length UTF-8
   strings; class names as a fixed-length byte-string dataset with int32 labels).
2. Runs data_test's DataHdf5Python case, which reads both with whittle, checks every value, and
   writes whittle.h5 and whittle_gzip.h5.
3. Reads whittle's files with h5py and checks dtypes, shapes, values, attributes and that no
   temporary file was left behind.

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

NAMES = ["cat", "dog", "\u00fcn\u00ef"]


def expected_images():
    return ((np.arange(5 * 3 * 4 * 6, dtype=np.int64) * 37 + 11) % 256).astype(np.uint8).reshape(5, 3, 4, 6)


def expected_labels():
    return np.array([2, 0, 1, 2, 1], dtype=np.int64)


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
            if fmt != "whittle-dataset" or int(f.attrs["version"]) != 1:
                fail(f"{name}: format/version attributes {fmt!r}/{f.attrs['version']!r}")
    leftovers = sorted(n for n in os.listdir(out) if ".tmp" in n)
    if leftovers:
        fail(f"temporary files left behind: {leftovers}")
    print("OK: whittle and h5py agree on the HDF5 dataset layout")


if __name__ == "__main__":
    main()
