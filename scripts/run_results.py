#!/usr/bin/env python3
"""Runs shipped recipes for a given number of epochs and prints the results table of docs/results.md.

usage: .venv/bin/python scripts/run_results.py [--epochs N] [--build DIR] [--table-only] RECIPE...

Each RECIPE (a path such as recipes/cifar10/resnet20_twn.yaml) is trained with
`whittle run RECIPE --set training.epochs=N --out runs/<dataset>/<name>_<N>ep`, unless that run
directory already holds a report.json for N epochs (then it is reused; delete the directory to
rerun). The table has one row per recipe: epochs run of the recipe's own schedule, method and
bits, test top-1/top-5, checkpoint bytes, ratio to the FP32 recipe of the same model (when that
run is in the table), wall time and training images/s. Exits 1 if any run fails.
"""
import argparse
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_dir(recipe, epochs):
    dataset = os.path.basename(os.path.dirname(os.path.abspath(recipe)))
    name = os.path.splitext(os.path.basename(recipe))[0]
    return os.path.join("runs", dataset, f"{name}_{epochs}ep")


def method_of(recipe_yaml):
    """'FP32' or e.g. 'DoReFa W2A2' from a recipe's quantize modifier."""
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipes", nargs="+")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--build", default="build")
    p.add_argument("--table-only", action="store_true", help="print the table of existing runs, train nothing")
    args = p.parse_args()
    os.chdir(ROOT)

    rows, failed = [], []
    for recipe in args.recipes:
        if not os.path.isfile(recipe):
            sys.exit(f"run_results.py: no recipe file {recipe}")
        out = run_dir(recipe, args.epochs)
        report_path = os.path.join(out, "report.json")
        fresh = os.path.isfile(report_path) and json.load(open(report_path)).get("epochs") == args.epochs
        if not fresh and not args.table_only:
            cmd = [os.path.join(args.build, "whittle"), "run", recipe, "--set", f"training.epochs={args.epochs}",
                   "--out", out, "--overwrite"]
            print("+", " ".join(cmd), flush=True)
            if subprocess.call(cmd, stdout=subprocess.DEVNULL) != 0:
                failed.append(recipe)
                continue
        if not os.path.isfile(report_path):
            print(f"(no run for {recipe} in {out})", file=sys.stderr)
            continue
        report = json.load(open(report_path))
        shipped = yaml.safe_load(open(recipe))
        rows.append((recipe, shipped, report))

    baseline = {}  # model name -> FP32 checkpoint bytes
    for recipe, shipped, report in rows:
        if method_of(shipped) == "FP32":
            baseline[report["model"]] = report["checkpoint_bytes"]

    print()
    print("| recipe | method | epochs run | test top-1 | top-5 | checkpoint | vs FP32 | wall time | train img/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for recipe, shipped, report in rows:
        fp = baseline.get(report["model"])
        ratio = f"{fp / report['checkpoint_bytes']:.1f}×" if fp else "—"
        planned = shipped["training"]["epochs"]
        print(f"| `{os.path.basename(recipe)}` | {method_of(shipped)} | {report['epochs']} of {planned} "
              f"| {100 * report['test_top1']:.2f} % | {100 * report['test_top5']:.2f} % "
              f"| {report['checkpoint_bytes']:,} B | {ratio} | {report['wall_seconds'] / 60:.1f} min "
              f"| {report['train_images_per_second']:.0f} |")
    if failed:
        print("failed:", " ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
