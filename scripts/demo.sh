#!/usr/bin/env bash
# `make demo`: trains LeNet-5 on the MNIST digits bundled in data/mnist10k twice, in FP32 and with
# 2-bit DoReFa quantization-aware training (recipes/mnist/lenet5{,_dorefa_w2a2}.yaml), and prints
# accuracy, checkpoint size and compression ratio side by side.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
echo "[demo] $("$build/whittle" --version | head -1)"
for recipe in lenet5 lenet5_dorefa_w2a2; do
  echo "[demo] whittle run recipes/mnist/$recipe.yaml --out runs/demo/$recipe --overwrite"
  "$build/whittle" run "recipes/mnist/$recipe.yaml" --out "runs/demo/$recipe" --overwrite
done
.venv/bin/python - <<'PY'
import json
fp = json.load(open("runs/demo/lenet5/report.json"))
q = json.load(open("runs/demo/lenet5_dorefa_w2a2/report.json"))
print()
print(f"  {'LeNet-5 on 2,000 MNIST test digits':38s} {'top-1':>8s} {'checkpoint':>12s} {'ratio':>7s}")
for name, r in [("FP32", fp), ("DoReFa W2A2 (2-bit weights and inputs)", q)]:
    ratio = fp["checkpoint_bytes"] / r["checkpoint_bytes"]
    print(f"  {name:38.38s} {100 * r['test_top1']:7.2f}% {r['checkpoint_bytes']:10d} B {ratio:6.1f}x")
print("\n  checkpoints: runs/demo/lenet5/model.h5, runs/demo/lenet5_dorefa_w2a2/model.h5 (build/whittle inspect FILE)")
PY
