#!/usr/bin/env python3
"""The CIFAR-10 CPU-budget results of docs/results.md: trains them, collects their summaries, prints the table.

usage: .venv/bin/python scripts/run_results.py [--train [STEM...]] [--collect] [--html FILE] [--build DIR]

The budget family (recipes/cifar10/resnet20_budget*.yaml): the 40-epoch FP32 ResNet-20, then each
method fine-tuned from its checkpoint, and micronet 1.12.0's quantizers fine-tuned the same way
(bench/micronet_cifar.py).

  (no option)  prints the Markdown table of docs/results.md from the committed run summaries
               (docs/results/cifar10_budget/<run>/: report.json, metrics.jsonl, recipe.yaml), read
               through `whittle report --json`.
  --train      trains what has no finished run yet, in dependency order (every step resumes an
               interrupted run: a run spans sittings), whittle's runs under runs/cifar10/ and
               micronet's under runs/micronet/; with STEMs only those (e.g. resnet20_budget_twn,
               micronet_twn). Then collects.
  --collect    copies the finished runs' summaries into docs/results/cifar10_budget/ (and the
               checkpoints of the runs others start from, so that --train on a fresh checkout
               restores them instead of training them again), adding report.json's
               model_summary from `whittle inspect --json` of the checkpoint where an earlier
               whittle wrote none) and writes docs/results.html (`whittle report --html`).
  --html FILE  writes the HTML report of the committed summaries to FILE.
  --build DIR  where the whittle program is (default: the repository's build/).
FILE and DIR are relative to the current directory; the script works from the repository root.
Exit status: 0 done, 1 when a run or a whittle command failed (whittle's error printed), 2 on bad
input (an option, a --build without whittle, a --html whose folder is missing).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARIES = os.path.join("docs", "results", "cifar10_budget")

# (whittle recipe stem, micronet method of bench/micronet_cifar.py or None, row label, W/A bits).
BUDGET = [
    ("resnet20_budget", None, "FP32", "32/32"),
    ("resnet20_budget_dorefa_w8a8", "dorefa_w8a8", "DoReFa W8A8", "8/8"),
    ("resnet20_budget_dorefa_w4a4", "dorefa_w4a4", "DoReFa W4A4", "4/4"),
    ("resnet20_budget_dorefa_w2a2", "dorefa_w2a2", "DoReFa W2A2", "2/2"),
    ("resnet20_budget_twn", "twn", "TWN", "ternary/32"),
    ("resnet20_budget_bnn", "bnn", "BNN", "1/1"),
    # micronet has one binary mode (binary weights scaled by mean |W|, sign activations): the same run.
    ("resnet20_budget_xnor", "bnn", "XNOR-Net", "1/1"),
    ("resnet20_budget_prune_l1", None, "pruned, L1, half the MACs", "32/32"),
    ("resnet20_budget_prune_w4a4", None, "pruned, then DoReFa W4A4", "4/4"),
    ("resnet20_budget_kd_w2a2", None, "DoReFa W2A2 student, KD from FP32", "2/2"),
    ("resnet20_budget_lsq_w4a4", None, "LSQ W4A4", "4/4"),
    ("resnet20_budget_lsq_w4a4_kd", None, "LSQ W4A4 student, KD from FP32", "4/4"),
    ("resnet20_budget_lsq_w3a3_kd", None, "LSQ W3A3 student, KD from FP32", "3/3"),
    ("resnet20_budget_lsq_w2a2_kd", None, "LSQ W2A2 student, KD from FP32", "2/2"),
    ("resnet20_budget_pact_w4a4_kd", None, "PACT W4A4 student, KD from FP32", "4/4"),
    ("resnet20_budget_pact_w2a2_kd", None, "PACT W2A2 student, KD from FP32", "2/2"),
    ("resnet20_budget_int8_ptq", None, "int8 post-training, percentile (no training)", "8/8"),
    ("resnet20_budget_int8_qat", None, "int8 QAT, BN folded (torch.ao's recipe)", "8/8"),
    ("resnet20_budget_reactnet", None, "W1A1, Bi-Real shortcuts, RSign + RPReLU, two stages, KD", "1/1"),
    ("resnet20_budget_xnor_w1a32", None, "XNOR-Net weights, real activations, KD", "1/32"),
]
# Runs each run starts from (trained first).
NEEDS = {"resnet20_budget_prune_w4a4": "resnet20_budget_prune_l1"}
# Runs others start from: --collect commits their checkpoints too, so that a fresh checkout can
# train the rest without training these again (train() restores them into runs/).
STARTING_POINTS = ["resnet20_budget", "resnet20_budget_prune_l1"]
SUMMARY_FILES = ("report.json", "metrics.jsonl", "recipe.yaml")


def fail(message, status=2):
    """One line on stderr and the exit status: 2 for bad input, 1 for a failed step."""
    print(f"run_results.py: {message}", file=sys.stderr)
    sys.exit(status)


def whittle(build, *args):
    """`whittle ARGS`' stdout; when whittle fails, its own error and exit status 1 (no traceback)."""
    r = subprocess.run([os.path.join(build, "whittle"), *args], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"whittle {args[0]} failed (exit status {r.returncode}): {r.stderr.strip() or 'no message'}", 1)
    return r.stdout


def method_of(recipe_yaml):
    """'FP32' or e.g. 'DoReFa W2A2' from a recipe's quantize modifier (scripts/seed_sweep.py)."""
    for m in recipe_yaml.get("modifiers") or []:
        if m.get("name") != "quantize":
            continue
        method = m.get("method")
        w, a = m.get("weight_bits"), m.get("activation_bits")
        if method == "dorefa":
            return f"DoReFa W{w}A{a}"
        names = {"twn": "TWN", "bnn": "BNN", "xnor": "XNOR-Net"}
        label = names.get(method, str(method))
        return label if a in (None, 1) else f"{label} (A{a})"
    return "FP32"


def whittle_dir(stem):
    return os.path.join("runs", "cifar10", stem)


def micronet_stem(method):
    return f"micronet_{method}"


def micronet_dir(method):
    return os.path.join("runs", "micronet", "resnet20_budget_" + method)


def finished(d):
    return os.path.isfile(os.path.join(d, "report.json"))


def restore_starting_points():
    """Copies committed starting points (summary and checkpoint) into runs/ where runs/ lacks them."""
    for stem in STARTING_POINTS:
        src, dst = os.path.join(SUMMARIES, stem), whittle_dir(stem)
        files = SUMMARY_FILES + ("model.h5",)
        if finished(dst) or not all(os.path.isfile(os.path.join(src, f)) for f in files):
            continue
        if os.path.exists(os.path.join(dst, "train_state.pt")):
            continue  # an interrupted run of its own is there: resume that instead
        os.makedirs(dst, exist_ok=True)
        for f in files:
            shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
        print(f"= {stem}: restored from {src}", flush=True)


def train(build, only):
    restore_starting_points()
    steps = []
    for stem, _, _, _ in BUDGET:
        if stem not in [s for s, _ in steps]:
            steps.append((stem, "whittle"))
    for _, m, _, _ in BUDGET:
        if m and (micronet_stem(m), "micronet") not in steps:
            steps.append((micronet_stem(m), "micronet"))
    if only:
        unknown = set(only) - {s for s, _ in steps}
        if unknown:
            fail(f"unknown run(s) {' '.join(sorted(unknown))}; known: {' '.join(s for s, _ in steps)}")
        steps = [s for s in steps if s[0] in only]
    for stem, tool in steps:
        if tool == "whittle":
            d = whittle_dir(stem)
            need = NEEDS.get(stem, "resnet20_budget" if stem != "resnet20_budget" else None)
            if need and not finished(whittle_dir(need)):
                sys.exit(f"run_results.py: {stem} starts from {whittle_dir(need)}, which has not finished")
            cmd = [os.path.join(build, "whittle"), "run", f"recipes/cifar10/{stem}.yaml"]
            resume = os.path.isfile(os.path.join(d, "train_state.pt"))
        else:
            method = stem[len("micronet_"):]
            d = micronet_dir(method)
            if not finished(whittle_dir("resnet20_budget")):
                sys.exit("run_results.py: micronet's runs start from runs/cifar10/resnet20_budget, which has not finished")
            cmd = [sys.executable, "bench/micronet_cifar.py", method, "--build", build]
            resume = os.path.isfile(os.path.join(d, "train_state.pt"))
        if finished(d):
            print(f"= {stem}: finished ({d})", flush=True)
            continue
        if resume:
            cmd.append("--resume")
        print("+", " ".join(cmd), flush=True)
        if subprocess.call(cmd) != 0:
            sys.exit(f"run_results.py: {stem} failed or was interrupted; rerun to continue")


def collect(build):
    os.makedirs(SUMMARIES, exist_ok=True)
    sources = [(stem, whittle_dir(stem)) for stem, _, _, _ in BUDGET]
    sources += sorted({(micronet_stem(m), micronet_dir(m)) for _, m, _, _ in BUDGET if m})
    for stem, d in sources:
        if not finished(d):
            continue
        dst = os.path.join(SUMMARIES, stem)
        os.makedirs(dst, exist_ok=True)
        rep = json.load(open(os.path.join(d, "report.json")))
        ckpt = os.path.join(d, os.path.basename(rep.get("checkpoint", "model.h5")))
        if "model_summary" not in rep and ckpt.endswith(".h5") and os.path.isfile(ckpt):
            j = json.loads(whittle(build, "inspect", ckpt, "--json"))
            rep["model_summary"] = {"nodes": j["nodes"], "total": {k: v for k, v in j["total"].items() if k != "file_bytes"}}
        with open(os.path.join(dst, "report.json"), "w") as f:
            json.dump(rep, f, indent=2)
            f.write("\n")
        for name in ("metrics.jsonl", "recipe.yaml"):
            shutil.copyfile(os.path.join(d, name), os.path.join(dst, name))
        if stem in STARTING_POINTS:
            shutil.copyfile(ckpt, os.path.join(dst, "model.h5"))
        print(f"collected {d} -> {dst}")
    write_html(build, os.path.join("docs", "results.html"))


def summary_dirs():
    dirs = [os.path.join(SUMMARIES, stem) for stem, _, _, _ in BUDGET]
    dirs += sorted({os.path.join(SUMMARIES, micronet_stem(m)) for _, m, _, _ in BUDGET if m})
    return [d for d in dirs if finished(d)]


def write_html(build, path):
    dirs = summary_dirs()
    if not dirs:
        sys.exit(f"run_results.py: no finished run summaries in {SUMMARIES}")
    whittle(build, "report", *dirs, "--html", path, "--overwrite", "--title",
            "whittle: ResNet-20 on CIFAR-10 in a CPU budget (whittle and micronet 1.12.0)")
    print(f"wrote {path}")


def minutes(s):
    if s is None or s < 0:
        return "—"
    if s < 60:
        return f"{s:.0f} s"  # a calibration
    return f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def capability(stem):
    """The ATen CPU capability a committed run recorded (its report.json), or None."""
    try:
        with open(os.path.join(SUMMARIES, stem, "report.json")) as f:
            return json.load(f).get("cpu_capability")
    except (OSError, ValueError):
        return None


def timed(seconds, from_wall, stem):
    """A run's training time for the table: * when taken from wall time, ‡ when the AVX2 machine ran it."""
    return (minutes(seconds) + ("*" if from_wall else "")
            + ("‡" if capability(stem) == "AVX2" else ""))


def table(build):
    """The Markdown table of docs/results.md from the committed run summaries (whittle report --json).

    Columns: MACs per image in millions; "vs FP32" is the FP32 checkpoint's bytes over the run's;
    "micronet file" has, in brackets, micronet's file size over whittle's checkpoint. † marks the
    XNOR-Net row's peer, micronet's one binary mode (the BNN run); ‡ a time measured on the AVX2
    machine (the others on the AVX-512 one); * a time taken from wall time.
    """
    dirs = summary_dirs()
    runs = {}
    if dirs:
        runs = {os.path.basename(r["dir"]): r for r in json.loads(whittle(build, "report", *dirs, "--json"))}
    fp32 = runs.get("resnet20_budget")
    lines = ["| method | W/A bits | MACs | epochs | top-1 | top-5 | checkpoint | vs FP32 | training time "
             "| micronet top-1 | micronet file (× whittle's) | micronet time |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for stem, m, label, bits in BUDGET:
        r = runs.get(stem)
        if r is None:
            continue
        ratio = f"{fp32['checkpoint_bytes'] / r['checkpoint_bytes']:.1f}×" if fp32 and r["checkpoint_bytes"] else "—"
        mn = runs.get(micronet_stem(m)) if m else None
        if mn:
            shared = "†" if stem == "resnet20_budget_xnor" else ""
            larger = f" ({mn['checkpoint_bytes'] / r['checkpoint_bytes']:.1f}×)" if r["checkpoint_bytes"] else ""
            peer = (f"{100 * mn['test_top1']:.2f} %{shared} | {mn['checkpoint_bytes']:,} B{larger} "
                    f"| {timed(mn['training_seconds'], mn['training_seconds_from_wall'], micronet_stem(m))}")
        else:
            peer = ("(starting point)" if stem == "resnet20_budget" else "—") + " | — | —"
        lines.append(f"| {label} | {bits} | {r['macs_per_image'] / 1e6:.1f} M | {r['epochs']} "
                     f"| **{100 * r['test_top1']:.2f} %** | {100 * r['test_top5']:.2f} % "
                     f"| {r['checkpoint_bytes']:,} B | {ratio} "
                     f"| {timed(r['training_seconds'], r['training_seconds_from_wall'], stem)} | {peer} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", nargs="*", metavar="STEM", help="train what is not finished (optionally only these)")
    p.add_argument("--collect", action="store_true")
    p.add_argument("--html", metavar="FILE")
    p.add_argument("--build", metavar="DIR", help="where the whittle program is (default: the repository's build/)")
    args = p.parse_args()
    # The caller's paths, resolved before the move to the repository root.
    build = os.path.abspath(args.build) if args.build else os.path.join(ROOT, "build")
    html = os.path.abspath(args.html) if args.html else None
    if not (os.path.isfile(os.path.join(build, "whittle")) and os.access(os.path.join(build, "whittle"), os.X_OK)):
        given = f"--build {args.build}: " if args.build else ""
        fail(f"{given}no whittle program at {os.path.join(build, 'whittle')} (build it first: ninja -C build whittle)")
    if html and os.path.isdir(html):
        fail(f"--html {args.html}: {html} is a folder, not a file")
    if html and not os.path.isdir(os.path.dirname(html)):
        fail(f"--html {args.html}: the folder {os.path.dirname(html)} is missing")
    os.chdir(ROOT)
    if args.train is not None:
        train(build, args.train)
        collect(build)
    elif args.collect:
        collect(build)
    if html:
        write_html(build, html)
    if args.train is None and not args.collect and not html:
        print(table(build))


if __name__ == "__main__":
    main()
