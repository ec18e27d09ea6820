#!/usr/bin/env python3
"""Runs recipes over several seeds and intra-op thread counts and prints mean and spread of test top-1.

usage: .venv/bin/python scripts/seed_sweep.py [--seeds 0,1,2] [--threads 1,2] [--jobs 2] [--build DIR]
                                             [--out DIR] [--set KEY=VALUE ...] [--json FILE] [--markdown]
                                             [--rerun] RECIPE...

Float results of a training run depend on the seed, and also on the intra-op thread count and on
the CPU instruction set ATen dispatches to (reductions are summed in another order), so one run's
accuracy says little about what another machine gets. This script trains every RECIPE once per
(seed, threads) pair with `whittle run RECIPE --set training.seed=S --set training.threads=T`, into
OUT/<recipe>/s<S>_t<T> (a run directory that already holds a report.json for the same settings and
recipe text is reused, unless --rerun: use it after rebuilding whittle), as many at a time as fit
in --jobs cores (a T-thread run takes T; results do not depend on how many run at once, only the
timings do). It prints one row per recipe: the runs, their mean, minimum, maximum and
standard deviation, and each run's figure; --json writes the same as a JSON list. Exits 1 if any
run fails.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import statistics
import subprocess
import sys

import yaml

from run_results import method_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_one(build, recipe, out, seed, threads, sets, rerun=False):
    """Trains one (recipe, seed, threads) run, or reuses it; returns its report.json as a dict.
    Raises RuntimeError when the run fails or leaves no readable report."""
    with open(os.path.join(ROOT, recipe), "rb") as f:
        text_hash = hashlib.sha256(f.read()).hexdigest()
    settings = {"recipe": recipe, "recipe_sha256": text_hash, "seed": seed, "threads": threads, "set": sets}
    stamp = os.path.join(out, "sweep.json")
    report_path = os.path.join(out, "report.json")
    try:
        if not rerun and os.path.isfile(report_path) and json.load(open(stamp)) == settings:
            return json.load(open(report_path))
    except (OSError, ValueError):
        pass  # no stamp or an unreadable one: train again
    cmd = [os.path.join(build, "whittle"), "run", recipe, "--out", out, "--overwrite", "--set", f"training.seed={seed}",
           "--set", f"training.threads={threads}"] + sum((["--set", s] for s in sets), [])
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-800:]}")
    try:
        report = json.load(open(report_path))
    except (OSError, ValueError) as e:
        raise RuntimeError(f"{' '.join(cmd)}: no readable report.json: {e}")
    with open(stamp, "w") as f:
        json.dump(settings, f)
    return report


def summarize(values):
    """(mean, min, max, sample standard deviation) of a list of percentages."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.mean(values), min(values), max(values), sd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipes", nargs="+")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--threads", default="1,2", help="comma-separated intra-op thread counts (default 1,2)")
    p.add_argument("--jobs", type=int, default=2, help="cores to use (default 2); a T-thread run takes T")
    p.add_argument("--build", help="build directory (default: build/ of the repository)")
    p.add_argument("--out", help="run directories (default: runs/sweep/ of the repository)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra override for every run")
    p.add_argument("--json", help="write the per-recipe results to this file")
    p.add_argument("--markdown", action="store_true", help="also print the table of docs/results.md")
    p.add_argument("--rerun", action="store_true", help="train every run again, even where a report exists")
    args = p.parse_args()
    # Paths on the command line are the caller's; runs start from the repository root.
    args.recipes = [os.path.relpath(os.path.abspath(r), ROOT) for r in args.recipes]
    args.out = os.path.abspath(args.out or os.path.join(ROOT, "runs", "sweep"))
    args.build = os.path.abspath(args.build or os.path.join(ROOT, "build"))
    args.json = os.path.abspath(args.json) if args.json else None
    os.chdir(ROOT)
    seeds = [int(s) for s in args.seeds.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    for recipe in args.recipes:
        if not os.path.isfile(recipe):
            sys.exit(f"seed_sweep.py: no recipe file {recipe}")

    # A run with T intra-op threads takes T of the --jobs cores: two 2-thread runs at once on two
    # cores spin against each other and take several times as long.
    futures = {}
    for t in threads:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs // t)) as pool:
            for recipe in args.recipes:
                name = os.path.splitext(os.path.basename(recipe))[0]
                for s in seeds:
                    out = os.path.join(args.out, name, f"s{s}_t{t}")
                    futures[(recipe, s, t)] = pool.submit(run_one, args.build, recipe, out, s, t, args.set, args.rerun)
    results, failed = [], []
    for recipe in args.recipes:
        runs = []
        for t in threads:
            for s in seeds:
                try:
                    rep = futures[(recipe, s, t)].result()
                except RuntimeError as e:
                    failed.append(str(e))
                    continue
                runs.append({"seed": s, "threads": t, "top1": 100 * rep["test_top1"],
                             "cpu_capability": rep.get("cpu_capability"), "wall_seconds": rep["wall_seconds"],
                             "checkpoint_bytes": rep["checkpoint_bytes"]})
        if not runs:
            continue
        mean, lo, hi, sd = summarize([r["top1"] for r in runs])
        results.append({"recipe": recipe, "runs": runs, "mean": mean, "min": lo, "max": hi, "stdev": sd})
        cells = "  ".join(f"s{r['seed']}/t{r['threads']} {r['top1']:.2f}" for r in runs)
        print(f"{os.path.basename(recipe):28s} n={len(runs)}  mean {mean:6.2f}  min {lo:6.2f}  max {hi:6.2f}  "
              f"sd {sd:4.2f}   {cells}", flush=True)
    caps = sorted({r["cpu_capability"] for res in results for r in res["runs"] if r["cpu_capability"]})
    print(f"(seeds {args.seeds}, threads {args.threads}; ATen CPU capability {', '.join(caps) or 'unknown'})")
    if args.markdown:
        print()
        print("| recipe | method | runs | mean top-1 | sd | min – max | checkpoint | wall time (median) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for res in results:
            shipped = yaml.safe_load(open(res["recipe"]))
            runs = res["runs"]
            print(f"| `{os.path.basename(res['recipe'])}` | {method_of(shipped)} | {len(runs)} | **{res['mean']:.2f} %** "
                  f"| {res['stdev']:.2f} | {res['min']:.2f} – {res['max']:.2f} | {runs[0]['checkpoint_bytes']:,} B "
                  f"| {statistics.median(r['wall_seconds'] for r in runs):.1f} s |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    for f in failed:
        print("failed:", f, file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
