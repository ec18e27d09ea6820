"""Post-training int8 side by side: whittle's calibrators against ONNX Runtime's quantize_static and
NNCF's post-training quantize, from the same FP32 checkpoint with the same calibration images;
accuracy on the test split, and speed in ONNX Runtime and in whittle's deploy runtime.

From the FP32 checkpoint (default: the CIFAR-10 ResNet-20 of the budget table,
runs/cifar10/resnet20_budget/model.h5; --model lenet5: runs/mnist/lenet5/model.h5 on the bundled
MNIST digits):
  - the calibration images: --images (512) training images drawn with numpy's RandomState(--seed),
    written in whittle's HDF5 dataset layout (calib.h5), so that every toolkit sees the same ones;
  - the float model in its folded deploy form (`whittle export --fold`: batch norms folded into the
    convolutions), the file both peers quantize;
  - whittle: `whittle calibrate` with each calibrator (minmax, moving_minmax, percentile, entropy,
    mse), without and with --bias-correction, over those images in batches of 128 (int8 weights per
    output channel, uint8 activations, batch norms folded first), exported to ONNX (int8 weight
    codes into DequantizeLinear);
  - ONNX Runtime 1.x quantize_static on the float file: QDQ, per channel, QInt8 weights, QUInt8
    activations, calibrate_method MinMax, Entropy and Percentile, the same images (normalized);
  - NNCF's nncf.quantize on the float file (its ONNX backend), the same images one by one
    (subset_size = --images), presets performance (symmetric activations) and mixed;
  - every model's top-1 on the whole test split in ONNX Runtime (and whittle's own evaluation of
    its int8 checkpoints, which must agree within a few images), and the best whittle checkpoint's
    on whittle's deploy runtime (`whittle eval --deploy`, integer kernels);
  - speed in ONNX Runtime, batch 1 and 32, 1 and 2 threads: the float file, whittle's best int8
    file and quantize_static's MinMax file (median of --repeats timed runs after warm-up); and in
    whittle's deploy runtime (`whittle bench`): the FP32 checkpoint (folded, float) and the best
    int8 checkpoint (integer kernels).
Prints a Markdown table and writes OUT/int8_compare.json. --speed-only times the files an earlier
run left in OUT (its int8_compare.json) without making them again: run it on an otherwise idle
machine.

usage: .venv/bin/python bench/int8_compare.py [--model resnet20|lenet5] [--fp32 CKPT] [--out DIR]
                                              [--images 512] [--seed 0] [--build build] [--repeats 30]
                                              [--no-speed] [--no-peers] [--speed-only]
Exit status 2 on bad input (an argument, a missing checkpoint or dataset), 1 when a step fails.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import h5py
import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
SCRIPT = "int8_compare.py"
WHITTLE_CALIBRATORS = ["minmax", "moving_minmax", "percentile", "entropy", "mse"]
ORT_METHODS = ["MinMax", "Entropy", "Percentile"]
MODELS = {
    "resnet20": ("recipes/cifar10/resnet20_budget.yaml", "runs/cifar10/resnet20_budget/model.h5"),
    "lenet5": ("recipes/mnist/lenet5.yaml", "runs/mnist/lenet5/model.h5"),
}


def fail(message, status=2):
    print(f"{SCRIPT}: {message}", file=sys.stderr)
    sys.exit(status)


def whittle(build, *args):
    r = subprocess.run([os.path.join(build, "whittle"), *args], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"whittle {' '.join(args)} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}", 1)
    return r.stdout


def load_data(model, recipe):
    """(train images, train labels, test images, test labels): uint8 N×C×H×W and int64."""
    d = recipe["data"]
    if model == "lenet5":
        from mnist_idx import load_split
        path = os.path.join(ROOT, d["train"])
        xtr, ytr = load_split(path, d.get("train_split", "train"))
        xte, yte = load_split(os.path.join(ROOT, d["test"]), d.get("test_split", "t10k"))
        return (np.asarray(xtr).reshape(-1, 1, 28, 28), np.asarray(ytr), np.asarray(xte).reshape(-1, 1, 28, 28),
                np.asarray(yte))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peer_cifar_common import load_split  # whittle's packed copy of the recipe's archive
    xtr, ytr = load_split(recipe, "train")
    xte, yte = load_split(recipe, "test")
    return xtr.numpy(), ytr.numpy().astype(np.int64), xte.numpy(), yte.numpy().astype(np.int64)


def normalize(x, mean, std):
    x = x.astype(np.float32) / 255.0
    if mean:
        m = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
        s = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
        x = (x - m) / s
    return x


def session(path, threads):
    import onnxruntime as ort
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])


def top1(path, x, y, threads=2, batch=500):
    s = session(path, threads)
    name = s.get_inputs()[0].name
    correct = 0
    for i in range(0, len(x), batch):
        logits = s.run(None, {name: x[i:i + batch]})[0]
        correct += int((logits.argmax(1) == y[i:i + batch]).sum())
    return correct / len(x)


def latency_ms(path, x, threads, repeats):
    s = session(path, threads)
    name = s.get_inputs()[0].name
    for _ in range(5):
        s.run(None, {name: x})
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        s.run(None, {name: x})
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def write_calibration_set(path, images, labels):
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.create_dataset("images", data=images)
        f.create_dataset("labels", data=labels.astype(np.int64))
        f.attrs["format"] = "whittle.dataset"
        f.attrs["format_version"] = np.int64(1)
    os.replace(tmp, path)


def ort_quantize(fp32_onnx, out, method, calib, input_name):
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{input_name: calib[i:i + 128]} for i in range(0, len(calib), 128)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(fp32_onnx, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=getattr(CalibrationMethod, method))


def nncf_quantize(fp32_onnx, out, preset, calib, input_name):
    import nncf
    import onnx
    model = onnx.load(fp32_onnx)
    data = nncf.Dataset([calib[i:i + 1] for i in range(len(calib))], lambda x: {input_name: x})
    q = nncf.quantize(model, data, subset_size=len(calib),
                      preset=getattr(nncf.QuantizationPreset, preset.upper()))
    onnx.save(q, out)


def deploy_ms(build, model, batch, threads, repeats):
    """whittle's deploy runtime (`whittle bench --json`): its median ms a batch of `model`, its runs
    back to back (`--back-to-back`) as latency_ms times ONNX Runtime's."""
    r = json.loads(whittle(build, "bench", model, "--batch", str(batch), "--threads", str(threads),
                           "--repeat", str(repeats), "--back-to-back", "--json"))
    return r["deploy_ms"]


def time_files(rows, out, test, repeats, no_peers, build, ckpt):
    """Latency at batch 1 and 32, 1 and 2 threads: in ONNX Runtime the float file, whittle's best int8
    file and quantize_static's MinMax file; in whittle's deploy runtime the FP32 checkpoint (folded,
    float kernels) and the best int8 checkpoint (integer kernels). Prints both tables and returns
    their rows."""
    best = max((r for r in rows if r["toolkit"] == "whittle"), key=lambda r: r["top1"])
    best_h5 = os.path.join(ROOT, best["file"][:-len(".onnx")] + ".h5")
    files = [("float (folded)", os.path.join(out, "fp32_fused.onnx")),
             (f"whittle int8 ({best['method']})", os.path.join(ROOT, best["file"]))]
    if not no_peers and os.path.isfile(os.path.join(out, "ort_minmax.onnx")):
        files.append(("quantize_static MinMax", os.path.join(out, "ort_minmax.onnx")))
    speed = []
    for batch in (1, 32):
        for threads in (1, 2):
            x = test[:batch]
            ms = [latency_ms(path, x, threads, repeats) for _, path in files]
            row = {"batch": batch, "threads": threads, **{n: v for (n, _), v in zip(files, ms)}}
            row["whittle deploy float"] = deploy_ms(build, ckpt, batch, threads, repeats)
            row["whittle deploy int8"] = deploy_ms(build, best_h5, batch, threads, repeats)
            speed.append(row)
    names = [n for n, _ in files]
    print("\n| ONNX Runtime, ms a batch | " + " | ".join(names) + " | whittle int8 / float | whittle int8 / quantize_static |")
    print("|---|" + "---:|" * (len(files) + 2))
    for r in speed:
        ms = [r[n] for n in names]
        ratios = f"{ms[1] / ms[0]:.2f}× | " + (f"{ms[1] / ms[2]:.2f}×" if len(ms) > 2 else "—")
        print(f"| batch {r['batch']}, {r['threads']} thread{'s' if r['threads'] > 1 else ''} | " +
              " | ".join(f"{v:.3f}" for v in ms) + f" | {ratios} |")
    print("\n| whittle deploy, ms a batch | float (folded) | int8 | int8 / float | int8 / ONNX Runtime on whittle's int8 file |")
    print("|---|---:|---:|---:|---:|")
    for r in speed:
        f, i, o = r["whittle deploy float"], r["whittle deploy int8"], r[names[1]]
        print(f"| batch {r['batch']}, {r['threads']} thread{'s' if r['threads'] > 1 else ''} | {f:.3f} | {i:.3f} | "
              f"{i / f:.2f}× | {i / o:.2f}× |", flush=True)
    return speed


def main():
    p = argparse.ArgumentParser(usage=__doc__.split("usage: ")[1].split("\n\n")[0])
    p.add_argument("--model", default="resnet20", choices=sorted(MODELS))
    p.add_argument("--fp32")
    p.add_argument("--out")
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--no-speed", action="store_true")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--speed-only", action="store_true")
    a = p.parse_args()
    recipe_path, default_ckpt = MODELS[a.model]
    ckpt = os.path.abspath(a.fp32 or os.path.join(ROOT, default_ckpt))
    out = os.path.abspath(a.out or os.path.join(ROOT, "runs", "int8_compare", a.model))
    build = os.path.abspath(a.build)
    if not os.path.isfile(ckpt):
        fail(f"{ckpt} is missing: train it with `build/whittle run {recipe_path}` (or give --fp32)")
    if not os.path.isfile(os.path.join(build, "whittle")):
        fail(f"no whittle program in {build} (give --build)")
    if a.images < 128 or a.images % 128:
        fail(f"--images {a.images}: a multiple of 128 (whittle calibrates in batches of 128)")
    os.makedirs(out, exist_ok=True)
    recipe = yaml.safe_load(open(os.path.join(ROOT, recipe_path)))
    if a.speed_only:
        earlier = os.path.join(out, "int8_compare.json")
        if not os.path.isfile(earlier):
            fail(f"--speed-only: {earlier} is missing (run without --speed-only first)")
        saved = json.load(open(earlier))
        _, _, xte, _ = load_data(a.model, recipe)
        test = normalize(xte, recipe["data"].get("mean"), recipe["data"].get("std"))
        speed = time_files(saved["rows"], out, test, a.repeats, a.no_peers, build, ckpt)
        saved["speed"] = speed
        with open(earlier, "w") as f:
            json.dump(saved, f, indent=2)
        print(f"\nwrote {earlier}")
        return
    mean, std = recipe["data"].get("mean"), recipe["data"].get("std")
    xtr, ytr, xte, yte = load_data(a.model, recipe)
    if a.images > len(xtr):
        fail(f"--images {a.images}: the training split has {len(xtr)}")
    pick = np.random.RandomState(a.seed).permutation(len(xtr))[:a.images]
    calib_path = os.path.join(out, "calib.h5")
    write_calibration_set(calib_path, xtr[pick], ytr[pick])
    calib = normalize(xtr[pick], mean, std)
    test = normalize(xte, mean, std)

    fp32_onnx = os.path.join(out, "fp32_fused.onnx")
    whittle(build, "export", ckpt, "--fold", "--out", fp32_onnx, "--overwrite")
    import onnx
    input_name = onnx.load(fp32_onnx).graph.input[0].name
    rows = []

    def add(toolkit, method, path, whittle_top1=None):
        t = top1(path, test, yte)
        rows.append({"toolkit": toolkit, "method": method, "file": os.path.relpath(path, ROOT), "bytes": os.path.getsize(path),
                     "top1": t, "whittle_eval_top1": whittle_top1})
        print(f"{toolkit:12s} {method:22s} top-1 {100 * t:6.2f} %  ({os.path.getsize(path):,} bytes)", flush=True)

    add("float", "folded FP32", fp32_onnx)
    batches = a.images // 128
    for cal in WHITTLE_CALIBRATORS:
        for corrected in (False, True):
            stem = f"whittle_{cal}" + ("_bc" if corrected else "")
            h5, onnx_path = os.path.join(out, stem + ".h5"), os.path.join(out, stem + ".onnx")
            whittle(build, "calibrate", ckpt, "--data", calib_path, "--method", cal, "--batches", str(batches),
                    "--batch-size", "128", "--out", h5, "--overwrite", *(["--bias-correction"] if corrected else []))
            whittle(build, "export", h5, "--out", onnx_path, "--overwrite")
            ev = json.loads(whittle(build, "eval", h5, "--json"))
            add("whittle", cal + (" + bias correction" if corrected else ""), onnx_path, ev["top1"])
    if not a.no_peers:
        for m in ORT_METHODS:
            path = os.path.join(out, f"ort_{m.lower()}.onnx")
            ort_quantize(fp32_onnx, path, m, calib, input_name)
            add("onnxruntime", f"quantize_static {m}", path)
        for preset in ("performance", "mixed"):
            path = os.path.join(out, f"nncf_{preset}.onnx")
            nncf_quantize(fp32_onnx, path, preset, calib, input_name)
            add("nncf", f"quantize {preset}", path)

    fp32 = rows[0]["top1"]
    best_whittle = max((r for r in rows if r["toolkit"] == "whittle"), key=lambda r: r["top1"])
    peers = [r for r in rows if r["toolkit"] in ("onnxruntime", "nncf")]
    best_peer = max(peers, key=lambda r: r["top1"]) if peers else None
    print("\n| toolkit | method | top-1 | vs FP32 | ONNX file |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        extra = f" (whittle eval {100 * r['whittle_eval_top1']:.2f} %)" if r["whittle_eval_top1"] is not None else ""
        print(f"| {r['toolkit']} | {r['method']} | {100 * r['top1']:.2f} %{extra} | {100 * (r['top1'] - fp32):+.2f} | "
              f"{r['bytes']:,} B |")
    print(f"\nwhittle's best ({best_whittle['method']}): {100 * (best_whittle['top1'] - fp32):+.2f} points from FP32"
          + (f"; the best peer ({best_peer['toolkit']} {best_peer['method']}): {100 * (best_peer['top1'] - fp32):+.2f}"
             if best_peer else ""))

    # The best int8 checkpoint on whittle's deploy runtime (integer kernels) against its graph.
    best_h5 = os.path.join(ROOT, best_whittle["file"][:-len(".onnx")] + ".h5")
    deploy_top1 = json.loads(whittle(build, "eval", best_h5, "--deploy", "--json"))["top1"]
    print(f"whittle eval --deploy of the best: {100 * deploy_top1:.2f} % (the graph: "
          f"{100 * best_whittle['whittle_eval_top1']:.2f} %)")

    speed = [] if a.no_speed else time_files(rows, out, test, a.repeats, a.no_peers, build, ckpt)
    with open(os.path.join(out, "int8_compare.json"), "w") as f:
        json.dump({"model": a.model, "checkpoint": os.path.relpath(ckpt, ROOT), "images": a.images, "seed": a.seed,
                   "rows": rows, "deploy_top1": deploy_top1, "speed": speed}, f, indent=2)
    print(f"\nwrote {os.path.join(out, 'int8_compare.json')}")


if __name__ == "__main__":
    main()
