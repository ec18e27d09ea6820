"""QAT training-step cost against FP32, from build/bench/bench_qat: the table of docs/performance.md.

Runs BM_TrainStep (ResNet-20 and NIN, batch 128, every method, fused quantizer kernels and the
ATen-op quantizers) with --repetitions repetitions randomly interleaved (Google Benchmark's
--benchmark_enable_random_interleaving: every repetition of every case is run in a shuffled order,
so that a slow stretch of the machine does not fall on one method), takes the median step time of
each case, and prints per model and method: the step time and its ratio to FP32's with the fused
kernels and without them, and the peak tensor memory of the step against FP32's.

usage: .venv/bin/python bench/qat_ratio.py [--build build] [--repetitions 5] [--filter REGEX] [--json FILE]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["resnet20", "nin"]
METHODS = ["fp32", "dorefa_w8a8", "dorefa_w4a4", "dorefa_w2a2", "twn", "bnn", "xnor"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--filter", default="BM_TrainStep/", help="benchmark filter (e.g. BM_TrainStep/0/ for ResNet-20)")
    ap.add_argument("--json", help="also keep Google Benchmark's JSON output in FILE")
    args = ap.parse_args()
    exe = os.path.join(ROOT, args.build, "bench", "bench_qat")
    out = args.json or os.path.join(ROOT, args.build, "bench", "qat_ratio.json")
    cmd = [exe, f"--benchmark_filter={args.filter}", f"--benchmark_repetitions={args.repetitions}",
           "--benchmark_enable_random_interleaving=true",
           f"--benchmark_out={out}", "--benchmark_out_format=json"]
    print(" ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    runs = json.load(open(out))["benchmarks"]
    times, peaks = {}, {}
    for b in runs:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        m = re.match(r"BM_TrainStep/(\d+)/(\d+)/(\d+)/(\d+)", b["name"])
        if not m:
            continue
        key = tuple(int(v) for v in m.groups())
        times.setdefault(key, []).append(b["real_time"])
        if "peak_MiB" in b:
            peaks.setdefault(key, []).append(b["peak_MiB"])
    med = {k: statistics.median(v) for k, v in times.items()}
    peak = {k: statistics.median(v) for k, v in peaks.items()}
    print(f"| model | method | step (fused) | vs FP32 | step (ATen ops) | vs FP32 | peak MiB (fused) | (ATen ops) | FP32 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for mi, model in enumerate(MODELS):
        base = med.get((mi, 0, 1, 0))
        if base is None:
            continue
        for k, method in enumerate(METHODS):
            f, a = med.get((mi, k, 1, 0)), med.get((mi, k, 0, 0))
            if f is None:
                continue
            cells = [model, method, f"{f:.1f} ms", f"{f / base:.3f}×"]
            cells += [f"{a:.1f} ms", f"{a / base:.3f}×"] if a is not None else ["—", "—"]
            pf, pa, p0 = peak.get((mi, k, 1, 0)), peak.get((mi, k, 0, 0)), peak.get((mi, 0, 1, 0))
            cells += [f"{pf:.0f}" if pf is not None else "—", f"{pa:.0f}" if pa is not None else "—",
                      f"{p0:.0f}" if p0 is not None else "—"]
            print("| " + " | ".join(cells) + " |")
    print("\nActivation checkpointing (fused kernels):\n")
    print("| model | method | step | checkpointed | ratio | peak MiB | checkpointed | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for mi, model in enumerate(MODELS):
        for k, method in enumerate(METHODS):
            plain, ck = med.get((mi, k, 1, 0)), med.get((mi, k, 1, 1))
            if plain is None or ck is None:
                continue
            pp, pc = peak.get((mi, k, 1, 0)), peak.get((mi, k, 1, 1))
            print(f"| {model} | {method} | {plain:.1f} ms | {ck:.1f} ms | {ck / plain:.3f}× | {pp:.0f} | {pc:.0f} | "
                  f"{pc / pp:.3f}× |")
    n = min((len(v) for v in times.values()), default=0)
    print(f"\n(median of {n} randomly interleaved repetitions of at least 3 s each; batch "
          f"{os.environ.get('WHITTLE_BENCH_BATCH', '128')}; {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
