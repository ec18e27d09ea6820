#!/usr/bin/env bash
set -euo pipefail
build=${1:-build}
"$build/whittle" --version
