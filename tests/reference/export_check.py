"""Runs whittle's exports in the runtimes users run them in, and compares with whittle's outputs.

    export_check.py FILE CHECK_DATA.h5 [FILE CHECK_DATA.h5 ...]

FILE is an ONNX model (run with onnxruntime's CPU provider) or a TorchScript file (torch.jit.load,
in this process, which imports nothing from whittle: only torch, onnx, onnxruntime, numpy, h5py).
CHECK_DATA.h5 is what `whittle export --check-data` writes: /inputs/<i> and /outputs/<i>.
Prints one JSON object per line and file:
  {"file", "format", "max_abs_difference", "max_abs_output", "relative", "bitwise_equal",
   "optimized_relative", "integer_kernels": {op: count} (ONNX: see check()),
   "op_types": {op: count} (ONNX), "quantize_linear": [{"node", "axis", "feeds", "input", "zero_point_type"}] (ONNX),
   "foreign_ops": TorchScript node kinds outside aten:: and prim:: (Python or custom ops; none expected)}
Exit status 0 unless a file cannot be run. The callers (export_runtime_test.py, export_test.cpp)
decide what bound to hold.
"""
import json
import os
import sys

import h5py
import numpy as np


def read_check_data(path):
    """(inputs, outputs): lists of float32 arrays in graph order."""
    with h5py.File(path, "r") as f:
        ins = [f["inputs"][k][()] for k in sorted(f["inputs"], key=int)]
        outs = [f["outputs"][k][()] for k in sorted(f["outputs"], key=int)]
    return ins, outs


def run_onnx(path, inputs, optimize=True, optimized_path=None):
    """Runs the file in onnxruntime (CPU, one thread). optimize=False: no graph optimization, so each
    node runs as ONNX defines it (DequantizeLinear then a float Conv); True: ONNX Runtime's own
    rewrites, which fuse Q/DQ patterns into integer kernels (QLinearConv, QLinearAdd, ...), written
    to `optimized_path` when given."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if optimized_path:
        options.optimized_model_filepath = optimized_path
        options.log_severity_level = 3  # its note that an optimized file is machine-specific
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(session.get_inputs(), inputs)}
    return session.run(None, feeds)


def run_torchscript(path, inputs):
    import torch

    module = torch.jit.load(path, map_location="cpu")
    module.eval()
    with torch.no_grad():
        r = module(*[torch.from_numpy(x) for x in inputs])
    if isinstance(r, (tuple, list)):
        return [t.numpy() for t in r]
    return [r.numpy()]


def onnx_structure(path):
    """Op-type counts; each QuantizeLinear with its axis, what its output feeds and its input's kind;
    each DequantizeLinear of an initializer (integer weight codes) with its axis, users and types; the
    bytes of float initializers and of the file."""
    import onnx

    model = onnx.load(path)
    g = model.graph
    counts = {}
    for n in g.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    consumers = {}
    for n in g.node:
        for i, name in enumerate(n.input):
            consumers.setdefault(name, []).append((n, i))
    producers = {o: n for n in g.node for o in n.output}
    initializers = {t.name for t in g.initializer}
    quantize = []
    for n in g.node:
        if n.op_type != "QuantizeLinear":
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        feeds = []
        for dq, _ in consumers.get(n.output[0], []):
            for user, slot in consumers.get(dq.output[0], []):
                feeds.append(f"{user.op_type}:{slot}")
        src = n.input[0]
        kind = "initializer" if src in initializers else (producers[src].op_type if src in producers else "input")
        zp = next((t for t in g.initializer if t.name == n.input[2]), None) if len(n.input) > 2 else None
        quantize.append({"node": n.name, "axis": axis, "feeds": feeds, "input": kind,
                         "zero_point_type": onnx.TensorProto.DataType.Name(zp.data_type) if zp is not None else None})
    # Weights stored as integer codes: DequantizeLinear nodes reading an initializer.
    dequantize_weights = []
    by_name = {t.name: t for t in g.initializer}
    for n in g.node:
        if n.op_type != "DequantizeLinear" or n.input[0] not in initializers:
            continue
        zp = by_name.get(n.input[2]) if len(n.input) > 2 else None
        dequantize_weights.append({
            "node": n.name, "axis": next((a.i for a in n.attribute if a.name == "axis"), 1),
            "feeds": [f"{user.op_type}:{slot}" for user, slot in consumers.get(n.output[0], [])],
            "input_type": onnx.TensorProto.DataType.Name(by_name[n.input[0]].data_type),
            "zero_point_type": onnx.TensorProto.DataType.Name(zp.data_type) if zp is not None else None})
    float_bytes = sum(4 * int(np.prod(t.dims)) for t in g.initializer if t.data_type == onnx.TensorProto.FLOAT)
    return {"op_types": counts, "quantize_linear": quantize, "dequantize_weights": dequantize_weights,
            "float_initializer_bytes": float_bytes, "bytes": os.path.getsize(path), "opset": model.opset_import[0].version,
            "input_dims": [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in g.input]}


def compare(path, got, expected):
    """(max |difference|, max |expected|, bitwise equal) over the outputs."""
    if len(got) != len(expected):
        raise SystemExit(f"{path}: {len(got)} outputs, whittle has {len(expected)}")
    diff = 0.0
    scale = 0.0
    bitwise = True
    for a, b in zip(got, expected):
        if a.shape != b.shape:
            raise SystemExit(f"{path}: output shape {a.shape}, whittle's {b.shape}")
        diff = max(diff, float(np.abs(a.astype(np.float64) - b).max()))
        scale = max(scale, float(np.abs(b).max()))
        bitwise = bitwise and np.array_equal(a, b)
    return diff, scale, bitwise


# Ops of ONNX Runtime's optimized graphs that compute on integer codes.
INTEGER_KERNELS = ("QLinearConv", "QLinearAdd", "QLinearConcat", "QLinearMatMul", "QGemm", "QLinearGlobalAveragePool",
                   "QLinearAveragePool", "QLinearMul", "ConvInteger", "MatMulInteger", "MatMulIntegerToFloat")


def check(path, data):
    """ONNX: "relative" (and max_abs_difference) is the file run as ONNX defines each node (no graph
    optimization); "optimized_relative" is ONNX Runtime's optimized run, whose integer kernels
    ("integer_kernels": their counts) requantize in integer arithmetic, so that a code next to a
    rounding boundary may land one level apart from whittle's float rounding."""
    inputs, expected = read_check_data(data)
    is_onnx = path.endswith(".onnx")
    got = run_onnx(path, inputs, optimize=False) if is_onnx else run_torchscript(path, inputs)
    diff, scale, bitwise = compare(path, got, expected)
    r = {"file": path, "format": "onnx" if is_onnx else "torchscript", "max_abs_difference": diff,
         "max_abs_output": scale, "relative": diff / scale if scale > 0 else diff, "bitwise_equal": bool(bitwise)}
    if is_onnx:
        import tempfile

        import onnx

        with tempfile.TemporaryDirectory() as tmp:
            optimized = os.path.join(tmp, "optimized.onnx")
            odiff, _, _ = compare(path, run_onnx(path, inputs, optimized_path=optimized), expected)
            ops = [n.op_type for n in onnx.load(optimized).graph.node]
        r["optimized_max_abs_difference"] = odiff
        r["optimized_relative"] = odiff / scale if scale > 0 else odiff
        r["integer_kernels"] = {k: ops.count(k) for k in INTEGER_KERNELS if k in ops}
        r.update(onnx_structure(path))
    else:
        import torch

        graph = torch.jit.load(path, map_location="cpu").inlined_graph
        r["foreign_ops"] = sorted({n.kind() for n in graph.nodes() if not n.kind().startswith(("aten::", "prim::"))})
    return r


def main(argv):
    if len(argv) < 2 or len(argv) % 2:
        raise SystemExit(__doc__)
    for path, data in zip(argv[0::2], argv[1::2]):
        print(json.dumps(check(path, data)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
