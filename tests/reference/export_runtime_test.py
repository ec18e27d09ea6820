"""`whittle export` of every zoo model, of the imported TorchScript classifiers and of every shipped
LeNet-5 recipe's checkpoint, run in onnxruntime and in torch.jit.load (this process imports nothing
from whittle), against whittle's own eval outputs on random inputs (`--check-data`).

Bounds (issue 15, docs/export.md): ONNX max |difference| ≤ 1e-5 of the largest output, each node run as
ONNX defines it (no graph optimization), and also in ONNX Runtime's optimized run, except where its
integer kernels run an int8 file: ≤ INTEGER_BOUND there (see below) (measured
worst: 1.6e-6 with 2 threads on AVX2, 1.9e-6 with OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default, so
a margin of 5× for other thread counts and instruction sets); TorchScript bitwise equal (the same
ATen calls in the same process configuration, whatever it is). TorchScript gives whittle's top-1
exactly. ONNX Runtime gives it within ONNX_TOP1 (0.25 points, 5 of the 2,000 test digits): its
logits differ from whittle's by ~1e-6, which moves no argmax of a float model, but a quantized
activation that lies that close to a rounding boundary of its grid rounds one level apart
(measured: 1 digit of 2,000, 0.05 points, for a W4A4 model trained with OMP_NUM_THREADS=1; none
with two threads; the margin of 5× is for other thread counts and instruction sets, whose
trainings put other activations near a boundary). The LeNet-5 checkpoints (each recipe trained for 1 epoch here: the export, not the
accuracy, is under test; also W4A4 fine-tuning of a traced PyTorch LeNet-5) must also give `whittle eval`'s top-1 on the 2,000 test digits in both
runtimes, and their ONNX files must carry the quantized forms: the DoReFa W4A4 weights as int8 codes
into DequantizeLinear (zero point int8, axis 0, no float copy) and activations as uint8
QuantizeLinear/DequantizeLinear, on the W8A8 activations; no BatchNormalization after `whittle fuse`
of the FP32 model (fewer for BNN and XNOR, whose BN + sign pairs become thresholds). The FP32 model
calibrated to int8 (`whittle calibrate`, entropy) exports the same way, its file at most 0.3x the
float one's; the W2A2 file at most 0.4x.

The three parts run as three CTest tests, in parallel: `export_runtime_test.py zoo | imported | recipes`.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import cli_harness as h  # noqa: E402
from export_check import check as run_check  # noqa: E402
from export_check import run_onnx, run_torchscript  # noqa: E402
from mnist_idx import load_split  # noqa: E402

ONNX_TOP1 = 0.0025  # ONNX Runtime's top-1 against whittle's: 5 digits of 2,000 (measured worst 1; see above)

PARTS = ("zoo", "imported", "recipes")
if len(sys.argv) != 2 or sys.argv[1] not in PARTS:
    sys.exit(f"usage: export_runtime_test.py {' | '.join(PARTS)}")
PART = sys.argv[1]
BOUND = 1e-5
# ONNX Runtime's optimized run of an int8 file: its integer kernels (QLinearConv, QLinearAdd, QGemm)
# requantize each layer's int32 sums with a float multiplier, where whittle divides the float
# layer's output by the scale; an output next to a rounding boundary lands one level apart.
# Measured on the calibrated LeNet-5: 0.0078 of the largest output (AVX-512 VNNI, 1 thread, as
# export_check runs it); about 4x margin for ONNX Runtime's AVX2 u8s8 kernels, whose requantization
# rounds at other points, on other machines.
INTEGER_BOUND = 0.03
OUT = h.out_dir(f"export_runtime_{PART}")
TS_DIR = os.path.join(h.BUILD, "testdata", "torchscript")
ZOO = ["lenet5", "vgg_small", "nin", "nin_gc", "resnet20", "resnet32", "resnet56", "mobilenet_v2", "repvgg_a0"]
# Imported TorchScript fixtures (make_torchscript_models.py) and their input shapes.
IMPORTED = {
    "resnet18": "1,3,224,224", "mobilenet_v2": "1,3,224,224", "vgg11_bn": "1,3,224,224", "squeezenet1_0": "1,3,224,224",
    "shufflenet_v2_x0_5": "1,3,224,224", "densenet121": "1,3,224,224", "efficientnet_b0": "1,3,224,224",
    "regnet_y_400mf": "1,3,224,224", "googlenet": "1,3,224,224", "mobilenet_v3_small": "1,3,224,224",
    "scripted_residual": "1,3,32,32", "tiny_unet": "1,3,32,32", "chunk_mix": "1,8,16,16",
}
RECIPES = ["lenet5", "lenet5_dorefa_w8a8", "lenet5_dorefa_w4a4", "lenet5_dorefa_w2a2", "lenet5_twn", "lenet5_bnn",
           "lenet5_xnor", "lenet5_prune", "lenet5_bnn_kd", "lenet5_dorefa_w2a2_kd"]
MEAN, STD = 0.1307, 0.3081


def whittle(*args):
    r = subprocess.run([h.BIN, *args], cwd=h.SRC, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
    return r


def export_and_check(name, model, *extra):
    """Exports `model` both ways; checks the bounds; returns the ONNX structure summary (or None)."""
    summary = None
    for ext in ("onnx", "pt"):
        path = os.path.join(OUT, f"{name}.{ext}")
        data = path + ".h5"
        r = whittle("export", model, "--out", path, "--check-data", data, *extra)
        if not h.check(r.returncode == 0, f"{name}: whittle export --out {os.path.basename(path)}"):
            continue
        res = run_check(path, data)
        if ext == "onnx":
            h.check(res["relative"] <= BOUND,
                    f"{name}: onnxruntime (each node as ONNX defines it) within {BOUND:g} of the largest output"
                    f" (max |diff| {res['max_abs_difference']:.3g} of {res['max_abs_output']:.3g}: {res['relative']:.2g})")
            bound = INTEGER_BOUND if res["integer_kernels"] else BOUND
            h.check(res["optimized_relative"] <= bound,
                    f"{name}: onnxruntime optimized ({res['integer_kernels'] or 'float kernels'}) within {bound:g}"
                    f" ({res['optimized_relative']:.2g})")
            summary = res
        else:
            h.check(res["bitwise_equal"] and not res["foreign_ops"],
                    f"{name}: torch.jit.load outputs bitwise equal (max |diff| {res['max_abs_difference']:.3g}), ATen and prim nodes only"
                    + (f" (also {res['foreign_ops']})" if res["foreign_ops"] else ""))
    return summary


def top1(predict, images, labels, batch=500):
    correct = 0
    for i in range(0, len(images), batch):
        x = ((images[i:i + batch].astype(np.float64) / 255.0 - MEAN) / STD).astype(np.float32)
        correct += int((np.argmax(predict(x), axis=1) == labels[i:i + batch]).sum())
    return correct / len(images)


def check_recipe_checkpoint(name, ckpt, images, labels):
    summary = export_and_check(name, ckpt)
    r = whittle("eval", ckpt, "--json")
    if not h.check(r.returncode == 0, f"{name}: whittle eval"):
        return summary
    expected = json.loads(r.stdout)["top1"]
    onnx_path, ts_path = os.path.join(OUT, f"{name}.onnx"), os.path.join(OUT, f"{name}.pt")
    if os.path.exists(onnx_path):
        got = top1(lambda x: run_onnx(onnx_path, [x])[0], images, labels)
        h.check(abs(got - expected) <= ONNX_TOP1,
                f"{name}: onnxruntime top-1 {100 * got:.2f}% = whittle eval's {100 * expected:.2f}% (± {100 * ONNX_TOP1:.2f})")
    if os.path.exists(ts_path):
        got = top1(lambda x: run_torchscript(ts_path, [x])[0], images, labels)
        h.check(got == expected, f"{name}: torch.jit.load top-1 {100 * got:.2f}% = whittle eval's {100 * expected:.2f}%")
    return summary


def quantized_weight(summary):
    """The weights stored as integer codes (DequantizeLinear of an initializer)."""
    return summary["dequantize_weights"]


def quantized_activation(summary):
    return [q for q in summary["quantize_linear"] if q["input"] != "initializer"]


def main():
    shutil.rmtree(OUT, ignore_errors=True)  # nothing of an earlier run may stand in for this one's files
    os.makedirs(OUT)
    if PART == "zoo":
        for name in ZOO:
            export_and_check(name, name)
    elif PART == "imported":
        for name, shape in IMPORTED.items():
            export_and_check(f"import_{name}", os.path.join(TS_DIR, name + ".pt"), "--input-shape", shape)
    else:
        check_recipes()
    h.finish()


def check_recipes():
    images, labels = load_split(h.MNIST, "t10k")
    runs = os.path.join(OUT, "runs")
    summaries = {}
    teacher = os.path.join(runs, "lenet5", "model.h5")
    for recipe in RECIPES:
        out = os.path.join(runs, recipe)
        sets = ["training.epochs=1"]
        if recipe == "lenet5_prune":
            sets.append(f"model.file={teacher}")
        if recipe.endswith("_kd"):
            sets.append(f"modifiers.0.teacher={teacher}")
        r = whittle("run", f"recipes/mnist/{recipe}.yaml", "--out", out, "--overwrite", *sum((["--set", s] for s in sets), []))
        if not h.check(r.returncode == 0, f"{recipe}: 1-epoch run"):
            continue
        summaries[recipe] = check_recipe_checkpoint(recipe, os.path.join(out, "model.h5"), images, labels)
        if recipe == "lenet5_dorefa_w4a4":  # outputs.export: [onnx, torchscript]
            report = json.load(open(os.path.join(out, "report.json")))
            exports = report.get("exports", {})
            paths = [os.path.join(out, "model.onnx"), os.path.join(out, "model.pt")]
            h.check(sorted(exports) == ["onnx", "torchscript"] and all(os.path.exists(p) for p in paths),
                    f"{recipe}: outputs.export wrote model.onnx and model.pt ({exports})")
            if all(os.path.exists(p) for p in paths):
                got = top1(lambda x: run_onnx(paths[0], [x])[0], images, labels)
                h.check(abs(got - report["test_top1"]) <= ONNX_TOP1,
                        f"{recipe}: the run's model.onnx gives the run's top-1 {100 * got:.2f}% (± {100 * ONNX_TOP1:.2f})")
    # A model imported from TorchScript (PyTorch's twin of the zoo LeNet-5, traced here), fine-tuned
    # with the W4A4 recipe, exports the same way.
    import torch
    from zoo_models import LeNet5
    traced = os.path.join(OUT, "lenet5_traced.pt")
    torch.manual_seed(1)  # not the recipe's seed 0, with which the zoo builder draws the same weights
    torch.jit.trace(LeNet5().eval(), torch.randn(1, 1, 28, 28)).save(traced)
    out = os.path.join(runs, "imported_w4a4")
    r = whittle("run", "recipes/mnist/lenet5_dorefa_w4a4.yaml", "--out", out, "--overwrite", "--set", "training.epochs=1",
                "--set", f"model.file={traced}")
    if h.check(r.returncode == 0, "imported_w4a4: 1-epoch W4A4 fine-tuning of a traced PyTorch LeNet-5"):
        s = check_recipe_checkpoint("imported_w4a4", os.path.join(out, "model.h5"), images, labels)
        if s:
            h.check(len(quantized_weight(s)) > 0, f"imported_w4a4: its 4-bit weights as int8 codes into DequantizeLinear ({len(quantized_weight(s))})")

    # Deploy forms: BN folded (FP32), BN + sign → threshold (BNN).
    for recipe in ("lenet5", "lenet5_bnn", "lenet5_xnor"):
        src = os.path.join(runs, recipe, "model.h5")
        fused = os.path.join(OUT, f"{recipe}_fused.h5")
        if not os.path.exists(src) or not h.check(whittle("fuse", src, "--out", fused).returncode == 0, f"{recipe}: whittle fuse"):
            continue
        s = check_recipe_checkpoint(f"{recipe}_fused", fused, images, labels)
        if not s:
            continue
        summaries[f"{recipe}_fused"] = s
        bn = s["op_types"].get("BatchNormalization", 0)
        if recipe == "lenet5":
            h.check(bn == 0, f"{recipe}_fused: no BatchNormalization node left ({s['op_types']})")
        elif summaries.get(recipe):
            # A BN after a binary layer whose output no binarizer reads (bn4 → the FP32 classifier) stays.
            before = summaries[recipe]["op_types"].get("BatchNormalization", 0)
            h.check(bn < before, f"{recipe}_fused: {before - bn} of {before} BatchNormalization nodes became thresholds")

    # Post-training int8 of the FP32 model (whittle calibrate, 4 batches of 128 training digits).
    if os.path.exists(teacher):
        int8 = os.path.join(OUT, "lenet5_int8.h5")
        r = whittle("calibrate", teacher, "--data", h.MNIST, "--method", "entropy", "--out", int8)
        if h.check(r.returncode == 0, "lenet5_int8: whittle calibrate"):
            s = check_recipe_checkpoint("lenet5_int8", int8, images, labels)
            if s:
                summaries["lenet5_int8"] = s
                weights, acts = quantized_weight(s), quantized_activation(s)
                h.check(len(weights) == 5 and all(q["input_type"] == "INT8" and q["zero_point_type"] == "INT8" for q in weights),
                        f"lenet5_int8: all five layers' weights as int8 codes into DequantizeLinear ({weights})")
                h.check(len(acts) == 5 and all(q["zero_point_type"] == "UINT8" for q in acts),
                        f"lenet5_int8: uint8 QuantizeLinear/DequantizeLinear on the five layers' inputs ({acts})")
                h.check(s["integer_kernels"].get("QLinearConv") == 2,
                        f"lenet5_int8: both convolutions run as ONNX Runtime's QLinearConv"
                        f" ({s['integer_kernels']}, {s['op_types']})")
            # The QOperator form: both convolutions as QLinearConv (conv2's DequantizeLinear moved past
            # the max pooling) and the three linear layers as MatMulInteger in the file itself, int32
            # biases, no DequantizeLinear left; it computes in integers unoptimized too, so both runs
            # hold INTEGER_BOUND.
            qop, qdata = os.path.join(OUT, "lenet5_int8_qop.onnx"), os.path.join(OUT, "lenet5_int8_qop.onnx.h5")
            r = whittle("export", int8, "--out", qop, "--qoperator", "--check-data", qdata)
            if h.check(r.returncode == 0, "lenet5_int8: whittle export --qoperator"):
                q = run_check(qop, qdata)
                ops = q["op_types"]
                h.check(ops.get("QLinearConv") == 2 and ops.get("MatMulInteger") == 3 and
                        not any(ops.get(k) for k in ("Conv", "Gemm", "DequantizeLinear")) and
                        q["relative"] <= INTEGER_BOUND and q["optimized_relative"] <= INTEGER_BOUND,
                        f"lenet5_int8: --qoperator writes QLinearConv and MatMulInteger only, onnxruntime within"
                        f" {INTEGER_BOUND:g}"
                        f" ({q['op_types']}, {q['relative']:.2g}, {q['optimized_relative']:.2g})")
                got = top1(lambda x: run_onnx(qop, [x])[0], images, labels)
                expected = json.loads(whittle("eval", int8, "--json").stdout)["top1"]
                h.check(abs(got - expected) <= ONNX_TOP1,
                        f"lenet5_int8: --qoperator top-1 {100 * got:.2f}% = whittle eval's {100 * expected:.2f}%"
                        f" (± {100 * ONNX_TOP1:.2f})")
    # Sizes: the int8 file at most 0.3x the float one, the W2A2 file at most 0.4x the float one
    # (both were float-sized while weights were written as floats).
    fp = summaries.get("lenet5")
    for name, bound in (("lenet5_int8", 0.3), ("lenet5_dorefa_w2a2", 0.4)):
        if fp and summaries.get(name):
            ratio = summaries[name]["bytes"] / fp["bytes"]
            h.check(ratio <= bound, f"{name}: ONNX file {summaries[name]['bytes']} bytes, {ratio:.3f}x the float one's "
                                    f"{fp['bytes']} (at most {bound})")
    if summaries.get("lenet5"):
        h.check(summaries["lenet5"]["op_types"].get("BatchNormalization", 0) > 0, "lenet5: BatchNormalization in inference form")
    if summaries.get("lenet5_bnn_fused"):
        h.check(summaries["lenet5_bnn_fused"]["op_types"].get("Sign", 0) > 0, "lenet5_bnn_fused: thresholds as Sign")
    w4 = summaries.get("lenet5_dorefa_w4a4")
    if w4:
        weights, acts = quantized_weight(w4), quantized_activation(w4)
        h.check(weights and all(q["axis"] == 0 and q["input_type"] == "INT8" and q["zero_point_type"] == "INT8" and any(f.startswith(("Conv:1", "Gemm:1")) for f in q["feeds"]) for q in weights),
                f"lenet5_dorefa_w4a4: int8 weight codes into DequantizeLinear on axis 0 feeding the layers' weights ({len(weights)})")
        h.check(not any(q["input"] == "initializer" for q in w4["quantize_linear"]),
                "lenet5_dorefa_w4a4: no float weight quantized in the file (QuantizeLinear of an initializer)")
        h.check(acts and all(q["zero_point_type"] == "UINT8" and q["input"] == "Clip" for q in acts),
                f"lenet5_dorefa_w4a4: uint8 QuantizeLinear/DequantizeLinear after Clip on the activations ({len(acts)})")
        h.check(w4["op_types"].get("DequantizeLinear", 0) == len(w4["quantize_linear"]) + len(weights),
                "lenet5_dorefa_w4a4: every QuantizeLinear and every weight has its DequantizeLinear")
    w8 = summaries.get("lenet5_dorefa_w8a8")
    if w8:
        h.check(len(quantized_activation(w8)) > 0 and not quantized_weight(w8),
                f"lenet5_dorefa_w8a8: activations quantized ({len(quantized_activation(w8))}), 8-bit DoReFa weights as float constants")


if __name__ == "__main__":
    main()
