#!/usr/bin/env bash
# `make demo`: trains the default recipe on the MNIST digits bundled in data/mnist10k and prints
# its result table.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
recipe=recipes/mnist/lenet5.yaml
echo "[demo] $("$build/whittle" --version | head -1)"
echo "[demo] whittle run $recipe --out runs/demo"
"$build/whittle" run "$recipe" --out runs/demo
