"""`whittle report`: run summaries, the Pareto front, training time over sittings, the HTML page
rendered in headless Chromium, and bad input.

Hand-made run directories give known values: four runs at (checkpoint bytes, top-1) (100000, 0.90),
(50000, 0.85), (60000, 0.80) and (40000, 0.70); the third is dominated by the second (smaller and
more accurate), so the front is the other three, in increasing size. A real two-epoch LeNet-5 run
checks the layer table read from report.json's model_summary. The page is rendered by Debian's
chromium (scripts/setup.sh installs it): the screenshot must not be blank and the page must log
nothing on the console; a page with a script error checks that such a message is seen.
"""
import io
import json
import os
import re
import shutil
import subprocess
import tempfile

from cli_harness import BIN, MNIST, SRC, check, finish, out_dir

from PIL import Image

work = out_dir("report")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def whittle(*args, cwd=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, cwd=cwd)


def make_run(name, top1, nbytes, modifiers, lines, report_extra=None):
    d = os.path.join(work, "runs", name)
    os.makedirs(d)
    rep = {"recipe": f"recipes/x/{name}.yaml", "model": "resnet20", "test_top1": top1, "test_top5": 0.99,
           "test_loss": 0.5, "test_images": 10000, "epochs": len(lines), "params": 1000, "macs_per_image": 2000,
           "checkpoint": f"runs/{name}/model.h5", "checkpoint_bytes": nbytes, "wall_seconds": 7.0,
           "train_images_per_second": 100.0, "device": "cpu"}
    rep.update(report_extra or {})
    json.dump(rep, open(os.path.join(d, "report.json"), "w"))
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for i, extra in enumerate(lines):
            line = {"epoch": i + 1, "train_loss": 1.0 / (i + 1), "train_top1": 0.5 + 0.1 * i, "test_top1": top1 - 0.01 * (len(lines) - 1 - i),
                    "test_top5": 0.99, "test_loss": 0.6 / (i + 1), "lr": 0.1}
            line.update(extra)
            f.write(json.dumps(line) + "\n")
    with open(os.path.join(d, "recipe.yaml"), "w") as f:
        f.write("model: {name: resnet20}\ndata: {train: x, test: x}\ntraining: {epochs: %d}\n" % len(lines))
        if modifiers:
            f.write("modifiers:\n" + "".join(f"  - {m}\n" for m in modifiers))
    return d


timed = {"train_seconds": 10.0, "eval_seconds": 2.0, "train_images": 500, "train_images_per_second": 50.0}
# Training time: 12 + 12 = 24 s from the timed lines.
a = make_run("fp32", 0.90, 100000, [], [timed, timed])
# Lines of an earlier whittle (no seconds): 500 images per epoch over each line's rate, 500/25 = 20 s,
# and a timed line of a later sitting (12 s): 32 s.
# Two quantize modifiers of one method over two groups of layers (two clip levels): named once.
b = make_run("w2a2", 0.85, 50000, ["{name: quantize, method: dorefa, weight_bits: 2, activation_bits: 2, targets: [conv1]}",
                                   "{name: quantize, method: dorefa, weight_bits: 2, activation_bits: 2, ignore: [conv1]}"],
             [{"train_images_per_second": 25.0}, timed])
c = make_run("pruned_w4a4", 0.80, 60000,
             ["{name: prune, criterion: l1, target_macs: 0.5}", "{name: quantize, method: dorefa, weight_bits: 4, activation_bits: 4}"],
             [timed])
# No timings at all: report.json's wall_seconds (7 s), flagged.
d = make_run("bnn_kd", 0.70, 40000, ["{name: distill, teacher: t.h5}", "{name: quantize, method: bnn}"],
             [{"train_images_per_second": 30.0}], {"tool": "micronet 1.12.0"})

r = whittle("report", a, b, c, d, "--json")
check(r.returncode == 0, f"report --json exits 0 ({r.stderr.strip()})")
runs = json.loads(r.stdout) if r.returncode == 0 else []
by = {x["label"]: x for x in runs}
check(sorted(by) == ["bnn_kd", "fp32", "pruned_w4a4", "w2a2"], f"labels are the run directories' names: {sorted(by)}")
if len(by) == 4:
    check(by["fp32"]["method"] == "FP32", f"no modifiers: FP32 ({by['fp32']['method']})")
    check(by["w2a2"]["method"] == "DoReFa W2A2", f"quantize dorefa 2/2, twice: named once ({by['w2a2']['method']})")
    check(by["pruned_w4a4"]["method"] == "pruned L1 (50 % MACs) + DoReFa W4A4", f"prune then quantize: {by['pruned_w4a4']['method']}")
    check(by["bnn_kd"]["method"] == "KD + BNN (micronet 1.12.0)", f"distill, bnn, another tool: {by['bnn_kd']['method']}")
    check(abs(by["fp32"]["training_seconds"] - 24.0) < 1e-9 and not by["fp32"]["training_seconds_from_wall"],
          f"training time sums the epochs' train + eval seconds: {by['fp32']['training_seconds']} (24)")
    check(abs(by["w2a2"]["training_seconds"] - 32.0) < 1e-9,
          f"an untimed line counts images per epoch over its rate: {by['w2a2']['training_seconds']} (20 + 12)")
    check([x["label"] for x in runs if x["pareto_front"]] == ["fp32", "w2a2", "bnn_kd"],
          "pareto_front: all but pruned_w4a4 (60000 B, 0.80: w2a2 is smaller and more accurate)")
    check(by["bnn_kd"]["training_seconds"] == 7.0 and by["bnn_kd"]["training_seconds_from_wall"],
          "no timed line: the last sitting's wall time, flagged")

# Edge cases: no epochs recorded; an epoch repeated after a kill (its last line counts); another
# tool's run with a model.pth and no model_summary, and a diverged (null) loss.
empty = make_run("empty", 0.5, 1000, [], [])
repeated = make_run("repeated", 0.6, 2000, [], [timed, timed])
with open(os.path.join(repeated, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"epoch": 2, "train_loss": 0.25, "train_top1": 0.9, "test_top1": 0.6, "test_top5": 0.99,
                        "test_loss": 0.3, "lr": 0.0, **timed}) + "\n")
peer = make_run("peer", 0.4, 3000, [], [dict(timed, test_loss=None)], {"tool": "micronet 1.12.0", "checkpoint": "runs/peer/model.pth",
                                                                    "test_loss": None})
open(os.path.join(peer, "model.pth"), "wb").write(b"not a whittle checkpoint")
# A run of 0 epochs (calibration only): its one metrics line, epoch 0, gives the time (3.5 s).
calibrated = make_run("calibrated", 0.55, 1500, ["{name: quantize, method: int8}"], [])
with open(os.path.join(calibrated, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"epoch": 0, "test_top1": 0.55, "test_top5": 0.99, "test_loss": 0.4, "calibration_seconds": 3.5,
                        "eval_seconds": 9.0}) + "\n")
r = whittle("report", empty, repeated, peer, calibrated, "--json", "--html", os.path.join(work, "edge.html"))
edge = {x["label"]: x for x in json.loads(r.stdout)} if r.returncode == 0 else {}
check(r.returncode == 0, f"no epochs, a repeated epoch, another tool's model.pth and a null loss: reported ({r.stderr.strip()})")
if edge:
    check(edge["repeated"]["training_seconds"] == 24.0, f"a repeated epoch counts once: {edge['repeated']['training_seconds']} s (24)")
    check(edge["peer"]["test_loss"] is None and edge["peer"]["method"] == "FP32 (micronet 1.12.0)", "a null loss stays null")
    check(edge["calibrated"]["training_seconds"] == 3.5 and not edge["calibrated"]["training_seconds_from_wall"],
          f"calibration only: the calibration's seconds ({edge['calibrated']['training_seconds']}, 3.5)")
    edge_page = open(os.path.join(work, "edge.html")).read()
    check("Calibration only (0 epochs)" in edge_page, "calibration only: said so in place of the curves")
    check("No epochs recorded" in edge_page and edge_page.count('<table class="layers">') == 0,
          "the empty run has no curves; no run has a layer table (none has a model summary or .h5 checkpoint)")

# Two runs with the same directory name are told apart by their parents.
for parent in ("seedA", "seedB"):
    src = os.path.join(work, "runs", "fp32")
    shutil.copytree(src, os.path.join(work, "twins", parent, "fp32"))
r = whittle("report", os.path.join(work, "twins", "seedA", "fp32"), os.path.join(work, "twins", "seedB", "fp32"), "--json")
labels = [x["label"] for x in json.loads(r.stdout)] if r.returncode == 0 else []
check(labels == ["seedA/fp32", "seedB/fp32"], f"same-named runs are labelled by the shortest distinct suffix: {labels}")

# The text table names every run.
r = whittle("report", a, b, c, d)
check(r.returncode == 0 and all(n in r.stdout for n in ("fp32", "w2a2", "pruned_w4a4", "bnn_kd")), "the text table lists the runs")

# A real run: its report.json carries the layer table.
real = os.path.join(work, "runs", "lenet5")
r = whittle("run", os.path.join(SRC, "recipes", "mnist", "lenet5.yaml"), "--set", "training.epochs=2",
            "--set", "data.train_limit=2000", "--out", real, cwd=SRC)
check(r.returncode == 0, "a 2-epoch LeNet-5 run finishes")
rep = json.load(open(os.path.join(real, "report.json"))) if r.returncode == 0 else {}
summary = rep.get("model_summary", {})
check([n["name"] for n in summary.get("nodes", []) if n["params"]][:2] == ["conv1", "bn1"] and
      summary.get("total", {}).get("params") == rep.get("params"),
      "report.json's model_summary lists the layers; its parameters total report.json's params")
lines = [json.loads(x) for x in open(os.path.join(real, "metrics.jsonl"))] if r.returncode == 0 else []
check(len(lines) == 2 and all(x["train_images"] == 1984 and x["train_seconds"] > 0 and x["eval_seconds"] > 0 for x in lines),
      "metrics lines carry train_images (2000 less the last partial batch of 64), train_seconds, eval_seconds")
if lines:
    spent = sum(x["train_seconds"] + x["eval_seconds"] for x in lines)
    check(spent <= rep["wall_seconds"], f"the epochs' training and evaluation ({spent:.2f} s) fit in the run's wall time ({rep['wall_seconds']:.2f} s)")
    # The rate is the training pass's alone: evaluation is not in it.
    check(all(abs(x["train_images_per_second"] * x["train_seconds"] - x["train_images"]) < 1e-6 * x["train_images"] for x in lines),
          "train_images_per_second = train_images / train_seconds, evaluation excluded")

html = os.path.join(work, "report.html")
r = whittle("report", a, b, c, d, real, "--html", html, "--title", "CIFAR & <friends>")
check(r.returncode == 0 and os.path.exists(html), f"--html writes the page ({r.stderr.strip()})")
page = open(html).read() if os.path.exists(html) else ""
front = re.findall(r'<circle [^>]*class="pt front" data-run="([^"]+)"', page)
dominated = re.findall(r'<circle [^>]*class="pt" data-run="([^"]+)"', page)
check(set(front) - {"lenet5"} == {"bnn_kd", "fp32", "w2a2"}, f"Pareto front marked: {sorted(front)}")
check("pruned_w4a4" in dominated, f"the dominated run is drawn hollow: {dominated}")
check("<title>CIFAR &amp; &lt;friends&gt;</title>" in page, "the title is escaped")
check("<script" not in page and not re.search(r'(src|href)="(?!#)', page) and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', ""),
      "self-contained: no script, no external resource")
check(page.count('class="curves-run"') == 2 * 5, "a loss and a top-1 chart per run")
check('<table class="layers">' in page and ">conv1<" in page, "the LeNet-5 run has its layer table")
check("*" in page and "wall time" in page, "the flagged training time is explained")

# The front's line joins its points in increasing size: x increases along it.
poly = re.search(r'<polyline class="front" fill="none" points="([^"]+)"', page)
xs = [float(p.split(",")[0]) for p in poly.group(1).split()] if poly else []
check(len(xs) == len(front) and xs == sorted(xs), f"the front's line runs in increasing size: {xs}")


def render(path, png):
    """Headless Chromium: screenshot to `png`; returns the console lines it logged. A Chromium that
    hangs is tried once more (a small /dev/shm in containers: --disable-dev-shm-usage avoids it)."""
    for attempt in range(2):
        prof = tempfile.mkdtemp(prefix="whittle_chromium_")
        try:
            p = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                "--hide-scrollbars", f"--user-data-dir={prof}", "--enable-logging=stderr", "--v=0",
                                "--window-size=1200,1600", f"--screenshot={png}", "file://" + os.path.abspath(path)],
                               capture_output=True, text=True, timeout=120)
            return [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
        except subprocess.TimeoutExpired:
            print(f"chromium did not finish rendering {path} in 120 s (try {attempt + 1} of 2)")
        finally:
            shutil.rmtree(prof, ignore_errors=True)
    return ["chromium timed out twice"]


def not_blank(png):
    """Share of pixels that are not white, and the number of distinct colours."""
    img = Image.open(png).convert("RGB")
    px = list(img.get_flattened_data()) if hasattr(img, 'get_flattened_data') else list(img.getdata())
    ink = sum(1 for p in px if p != (255, 255, 255)) / len(px)
    return ink, len(set(px))


if shutil.which("chromium") is None:
    check(False, "chromium is installed (scripts/setup.sh installs Debian's chromium)")
else:
    bad = os.path.join(work, "bad.html")
    open(bad, "w").write('<!DOCTYPE html><html><body><p>x</p><script>undefined_function();</script></body></html>')
    check(any("undefined_function" in ln for ln in render(bad, os.path.join(work, "bad.png"))),
          "control: a page's script error is seen on the console")
    png = os.path.join(work, "report.png")
    console = render(html, png)
    check(console == [], f"the report logs nothing on the console: {console}")
    if os.path.exists(png):
        ink, colours = not_blank(png)
        check(ink > 0.03 and colours > 20, f"the screenshot is not blank: {100 * ink:.1f} % of pixels inked, {colours} colours")
    else:
        check(False, "chromium wrote the screenshot")
    committed = os.path.join(SRC, "docs", "results.html")
    if os.path.exists(committed):
        shot = os.path.join(work, "results.png")
        console = render(committed, shot)
        ink, colours = not_blank(shot) if os.path.exists(shot) else (0.0, 0)
        check(console == [] and ink > 0.03 and colours > 20,
              f"docs/results.html renders: {100 * ink:.1f} % inked, {colours} colours, console {console}")

# Bad input: each names what and where, exits non-zero, writes nothing.
missing = os.path.join(work, "no_such_run")
r = whittle("report", a, missing, "--html", os.path.join(work, "never.html"))
check(r.returncode != 0 and missing in r.stderr and not os.path.exists(os.path.join(work, "never.html")),
      f"a missing run directory is named, nothing written: {r.stderr.strip()}")
unfinished = os.path.join(work, "runs", "unfinished")
os.makedirs(unfinished)
r = whittle("report", unfinished)
check(r.returncode != 0 and "no report.json" in r.stderr and unfinished in r.stderr, f"a run without report.json: {r.stderr.strip()}")
broken = make_run("broken", 0.5, 1, [], [timed])
open(os.path.join(broken, "report.json"), "w").write('{"model": "resnet20", "test_top1": ')
r = whittle("report", broken)
check(r.returncode != 0 and os.path.join(broken, "report.json") in r.stderr and "not valid JSON" in r.stderr,
      f"a truncated report.json is named: {r.stderr.strip()}")
badline = make_run("badline", 0.5, 1, [], [timed, timed])
with open(os.path.join(badline, "metrics.jsonl"), "a") as f:
    f.write('{"epoch": 3, "train_loss": \n')
r = whittle("report", badline)
check(r.returncode != 0 and os.path.join(badline, "metrics.jsonl") + ":3" in r.stderr, f"a bad metrics line is named by file:line: {r.stderr.strip()}")
notrun = make_run("wrongkind", 0.5, 1, [], [timed])
json.dump({"hello": 1}, open(os.path.join(notrun, "report.json"), "w"))
r = whittle("report", notrun)
check(r.returncode != 0 and "not a whittle run report" in r.stderr, f"another JSON file: {r.stderr.strip()}")
badyaml = make_run("badyaml", 0.5, 1, [], [timed])
open(os.path.join(badyaml, "recipe.yaml"), "w").write("modifiers: [\n  {name: quantize\n")
r = whittle("report", badyaml)
check(r.returncode != 0 and os.path.join(badyaml, "recipe.yaml") in r.stderr and "not valid YAML" in r.stderr,
      f"a recipe.yaml that is not YAML is named: {r.stderr.strip()}")
r = whittle("report")
check(r.returncode == 2 and "missing RUN_DIR" in r.stderr, "no run directory: usage error (exit 2)")
r = whittle("report", a, "--html", work)
check(r.returncode == 2 and "is a directory" in r.stderr, "--html naming a directory: usage error")
finish()
