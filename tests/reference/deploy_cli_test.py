"""`whittle eval --deploy` and `whittle bench` on a LeNet-5 BNN trained for one epoch from the
command line: the deploy runtime gives the same top-1 and loss as the training graph, bench's
report covers every node once and its outputs agree with the float execution, and bad arguments
get a usage error."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from cli_harness import BIN, SRC, check, finish, out_dir  # noqa: E402

OUT = out_dir("deploy_cli")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, cwd=SRC)


run_dir = os.path.join(OUT, "lenet5_bnn")
r = run("run", "recipes/mnist/lenet5_bnn.yaml", "--set", "training.epochs=1", "--set", "data.train_limit=2048",
        "--set", "data.num_workers=1", "--set", f"outputs.dir={run_dir}")
check(r.returncode == 0, f"short LeNet-5 BNN run (exit {r.returncode}) {r.stderr[-400:]}")
model = os.path.join(run_dir, "model.h5")

graph = json.loads(run("eval", model, "--json").stdout)
dep_run = run("eval", model, "--deploy", "--json")
check(dep_run.returncode == 0, f"eval --deploy exits 0 ({dep_run.stderr[-300:]})")
dep = json.loads(dep_run.stdout)
check(dep["runtime"] == "deploy" and graph["runtime"] == "graph", "eval --json names the runtime")
check(dep["samples"] == graph["samples"] == 2000, f"both evaluate the 2,000 test digits ({dep['samples']})")
# Exact equality of the counts: the two logits differ by float rounding only (about 1e-7 relative);
# checked with 2 threads and AVX-512, with OMP_NUM_THREADS=1 and ATEN_CPU_CAPABILITY=default, and
# with WHITTLE_KERNEL_ISA=scalar.
check(dep["top1"] == graph["top1"] and dep["top5"] == graph["top5"],
      f"eval --deploy top-1 {dep['top1']:.4f} / top-5 {dep['top5']:.4f} == eval's {graph['top1']:.4f} / {graph['top5']:.4f}")
check(abs(dep["loss"] - graph["loss"]) <= 1e-4 * abs(graph["loss"]),
      f"eval --deploy loss {dep['loss']:.6f} within 1e-4 relative of {graph['loss']:.6f}")

b = run("bench", model, "--json", "--repeat", "3", "--threads", "1", "--batch", "4")
check(b.returncode == 0, f"bench exits 0 ({b.stderr[-300:]})")
rep = json.loads(b.stdout)
check(rep["batch"] == 4 and rep["threads"] == 1 and rep["repeat"] == 3, "bench reports its settings")
check(rep["packed_layers"] == 3, f"bench: conv2, fc1 and fc2 run binary ({rep['packed_layers']})")
kernels = [s["kernel"] for s in rep["steps"]]
check("binary_conv2d + threshold" in kernels and "max_pool2d_signs" in kernels, f"bench lists the kernels: {kernels}")
nodes = [n for s in rep["steps"] for n in s["nodes"].split(" + ")]
check(len(nodes) == len(set(nodes)) and {"conv1", "conv2", "fc1", "fc2", "fc3"} <= set(nodes),
      "bench: every node in exactly one step")
check(rep["max_relative_difference"] < 1e-4, f"bench: deploy vs float outputs {rep['max_relative_difference']:.2e} < 1e-4")
check(all(s["deploy_ms"] >= 0 and s["float_ms"] >= 0 for s in rep["steps"]) and rep["deploy_ms"] > 0
      and rep["float_ms"] > 0, "bench: times are positive")
text = run("bench", model, "--repeat", "2")
check(text.returncode == 0 and "total (whole forward)" in text.stdout and "throughput: deploy" in text.stdout,
      "bench prints the table")

# Bad input: a usage error (exit 2) naming what is wrong, or a runtime error naming the file.
for args, code, words in [
    (["bench", model, "--batch", "0"], 2, "--batch"),
    (["bench", model, "--threads", "-1"], 2, "--threads"),
    (["bench"], 2, "missing MODEL"),
    (["bench", os.path.join(OUT, "missing.h5")], None, "missing.h5"),
    (["eval", model, "--deploy", "--device", "cuda"], 2, "--deploy runs on the CPU"),
    (["bench", model, "--input-shape", "1,1,32,32"], 2, "a checkpoint keeps the input shape"),
    (["eval", os.path.join(SRC, "recipes", "mnist", "lenet5_bnn.yaml")], 2, "is not a whittle checkpoint"),
]:
    e = run(*args)
    ok_code = e.returncode == code if code is not None else e.returncode != 0
    check(ok_code and words in e.stderr, f"{' '.join(args[:1] + args[2:] if len(args) > 1 else args)}: exit "
          f"{e.returncode}, stderr names '{words}' ({e.stderr.strip()[-200:]})")

e = subprocess.run([BIN, "bench", model, "--repeat", "1"], capture_output=True, text=True, cwd=SRC,
                   env={**os.environ, "WHITTLE_KERNEL_ISA": "bogus"})
check(e.returncode == 2 and "environment variable WHITTLE_KERNEL_ISA" in e.stderr and "bogus" in e.stderr,
      f"bench with WHITTLE_KERNEL_ISA=bogus: exit {e.returncode}, names the variable ({e.stderr.strip()[-200:]})")

finish()
