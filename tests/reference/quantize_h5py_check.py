"""Decodes whittle's packed checkpoints with h5py and numpy alone (docs/checkpoint-format.md).

1. Runs quantize_checkpoint_test's WriteForPython case, which writes, for each method, a packed
   ResNet-20 checkpoint <method>.h5 and <method>_decoded.h5 with the weights the model runs with,
   as plain float32 tensors; and for each checkpoint of tests/fixtures/ (written when 3-bit codes
   took 4-bit fields and 5..7-bit codes whole bytes) the checkpoint as whittle loads and writes it
   again, fixture_<stem>.h5, with fixture_<stem>_decoded.h5.
2. For every node of <method>.h5 with a packed weight: unpacks the bytes (a little-endian bitstream
   of packed_bits-wide codes), maps codes to values by the documented encoding, and compares with
   the decoded file. Values must agree to float32 rounding of the documented formulas (a few ulp).
   The fixture files themselves are decoded too (at their own packed_bits) and must agree with
   the same decoded file: loading repacks, it does not change a code.
3. Checks that no float weight of a quantized layer is stored, that the packed dataset's byte
   count is ceil(count * packed_bits / 8), and that files whittle writes pack without gaps
   (packed_bits = bits).

Usage: quantize_h5py_check.py <path to quantize_checkpoint_test>
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np


FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def unpack(data, packed_bits, count):
    stream = np.unpackbits(data, bitorder="little")[:count * packed_bits].reshape(count, packed_bits)
    return (stream.astype(np.uint16) << np.arange(packed_bits, dtype=np.uint16)).sum(1).astype(np.uint8)


def decode(codes, scale, encoding, bits, axis, shape):
    c = codes.reshape(shape).astype(np.float32)
    s_shape = [1] * len(shape)
    s_shape[axis] = scale.size
    s = scale.astype(np.float32).reshape(s_shape)
    if encoding == "dorefa":
        n = np.float32((1 << bits) - 1)
        return (c / n * np.float32(2) - np.float32(1)) * s
    if encoding == "sign":
        return (c * np.float32(2) - np.float32(1)) * s
    if encoding == "ternary":
        return (c - np.float32(1)) * s
    if encoding == "uniform":
        return (c - np.float32(1 << (bits - 1))) * s
    fail("unknown encoding " + encoding)


def read_tensors(f):
    """All tensors of a whittle checkpoint as {(node, name): (array, index entry)}, from
    /tensors/index (JSON) and /tensors/data (one uint8 array), checking each CRC-32."""
    import zlib

    index = json.loads(f["tensors/index"][()].tobytes().decode())
    blob = f["tensors/data"][()]
    out = {}
    for e in index:
        raw = blob[e["offset"]:e["offset"] + e["nbytes"]].tobytes()
        if zlib.crc32(raw) != e["crc32"]:
            fail(f"{e['node']}.{e['name']}: CRC-32 mismatch")
        dtype = np.uint8 if e["dtype"] == "bool" else np.dtype(e["dtype"])
        out[(e["node"], e["name"])] = (np.frombuffer(raw, dtype=dtype).reshape(e["shape"]), e)
    return out


def check(packed_path, decoded_path, dense=True):
    checked = 0
    with h5py.File(packed_path, "r") as f, h5py.File(decoded_path, "r") as ref:
        graph = json.loads(f["graph"][()].tobytes().decode())
        tensors = read_tensors(f)
        ref_tensors = read_tensors(ref)
        for node in graph["nodes"]:
            attrs = {k: v["value"] for k, v in node["attrs"].items()}
            if node.get("weight_transforms") != ["packed"]:
                continue
            if (node["name"], "weight") in tensors:
                fail(f"{packed_path}: {node['name']} stores a float weight")
            data, entry = tensors[(node["name"], "weight_codes")]
            packed = entry["packed"]
            bits = int(packed["bits"])
            packed_bits = int(packed["packed_bits"])
            shape = [int(d) for d in packed["shape"]]
            encoding = packed["encoding"]
            axis = int(packed["axis"])
            if bits != attrs["weight_bits"] or shape != attrs["weight_shape"] or encoding != attrs["weight_encoding"]:
                fail(f"{node['name']}: index entry disagrees with the graph attributes")
            if data.dtype != np.uint8:
                fail(f"{node['name']}: codes are {data.dtype}, expected uint8")
            count = int(np.prod(shape))
            if dense and packed_bits != bits:
                fail(f"{packed_path}: {node['name']}: {bits}-bit codes written at packed_bits {packed_bits}")
            if data.size != (count * packed_bits + 7) // 8:
                fail(f"{node['name']}: {data.size} bytes for {count} codes of {packed_bits} bits")
            scale = tensors[(node["name"], "weight_scale")][0]
            if scale.dtype != np.float32:
                fail(f"{node['name']}: scale is {scale.dtype}")
            w = decode(unpack(data, packed_bits, count), scale, encoding, bits, axis, shape)
            want = ref_tensors[(node["name"], "weight")][0]
            if want.shape != w.shape:
                fail(f"{node['name']}: shape {w.shape} vs {want.shape}")
            err = np.abs(w - want).max()
            tol = 4 * np.finfo(np.float32).eps * max(1.0, float(np.abs(want).max()))
            if err > tol:
                fail(f"{packed_path}: {node['name']} ({encoding}, {bits} bits): max |diff| {err} > {tol}")
            checked += 1
    if checked == 0:
        fail(f"{packed_path}: no packed layer found")
    return checked


def main():
    if len(sys.argv) != 2:
        fail("usage: quantize_h5py_check.py <quantize_checkpoint_test>")
    out = tempfile.mkdtemp(prefix="whittle_quant_h5py_")
    try:
        env = dict(os.environ, WHITTLE_QUANT_H5PY_DIR=out)
        r = subprocess.run([sys.argv[1], "--gtest_filter=PackedCheckpointTest.WriteForPython"], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0 or "[  PASSED  ] 1 test" not in r.stdout:
            fail("WriteForPython failed:\n" + r.stdout + r.stderr)
        names = sorted(n[:-3] for n in os.listdir(out) if n.endswith(".h5") and not n.endswith("_decoded.h5"))
        if len(names) < 13:
            fail("expected 13 checkpoints, got " + ", ".join(names))
        for name in names:
            n = check(os.path.join(out, name + ".h5"), os.path.join(out, name + "_decoded.h5"))
            print(f"{name}: {n} packed layers decoded with h5py + numpy match")
            if name.startswith("fixture_"):
                original = os.path.join(FIXTURES, name[len("fixture_"):] + ".h5")
                n = check(original, os.path.join(out, name + "_decoded.h5"), dense=False)
                print(f"{original}: {n} packed layers (wider fields) decode to the same weights")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print("OK")


if __name__ == "__main__":
    main()
