"""Reads the bundled MNIST digits (IDX format, gzip-compressed) for the Python reference scripts."""
import gzip
import os

import numpy as np


def load_idx(path):
    """An IDX file: images as uint8 [N, 1, H, W] (magic 0x803) or labels as int64 [N] (0x801)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    if magic == 0x803:
        n, h, w = (int.from_bytes(data[i:i + 4], "big") for i in (4, 8, 12))
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, 1, h, w)
    if magic != 0x801:
        raise ValueError(f"{path}: not an IDX image or label file (magic {magic:#x})")
    return np.frombuffer(data, np.uint8, offset=8).astype(np.int64)


def load_split(root, split):
    """(images uint8 [N, 1, 28, 28], labels int64 [N]) of split 'train' or 't10k' under `root`."""
    images = load_idx(os.path.join(root, f"{split}-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(root, f"{split}-labels-idx1-ubyte.gz"))
    return images.copy(), labels.copy()
