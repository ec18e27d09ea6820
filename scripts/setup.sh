#!/usr/bin/env bash
# Installs everything whittle needs on a Debian 12 machine, idempotently:
#   1. Debian packages (toolchain, CMake, Ninja, ccache, Eigen, Boost, HDF5, yaml-cpp, GoogleTest,
#      ONNX with protobuf, ...)
#   2. a project-local Python virtual environment .venv/ with the pinned LibTorch (the `torch`
#      wheel from PyPI) and the Python packages that the reference tests use.
# A second run with nothing to do only checks, and finishes in a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential g++ cmake ninja-build ccache lld pkg-config git python3 python3-venv
  libeigen3-dev libboost-program-options-dev libhdf5-dev libyaml-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libturbojpeg0-dev libpng-dev zlib1g-dev libarchive-dev
  libonnx-dev libprotobuf-dev
  libgloo-dev
  chromium
  clang-format clang-tidy
  clang libclang-rt-14-dev llvm
)
# The pinned LibTorch version and the reference-test packages (see requirements.txt).
REQUIREMENTS=requirements.txt
VENV=.venv

log() { printf '[setup] %s\n' "$*"; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "Debian packages: all ${#APT_PACKAGES[@]} present"
fi

# Python: prefer the interpreter on PATH (pyenv or Debian's), which must have venv.
PY=${PYTHON:-python3}
stamp="$VENV/.whittle-requirements"
want=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "Python environment $VENV: up to date ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
else
  log "creating or updating Python environment $VENV with $(grep -E '^torch' "$REQUIREMENTS" | head -1) (first time: a few GB of wheels)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # Installed without pip's byte-compiling, then compiled on every core at once (PYTHONDONTWRITEBYTECODE
  # is common in CI: each process would otherwise compile what it imports, torch's thousands of
  # modules, every time). A module that does not compile (a package's templates) is left as it is.
  "$VENV/bin/python" -m pip install -q --no-compile -r "$REQUIREMENTS"
  "$VENV/bin/python" -m compileall -q -q -j 0 "$VENV"/lib/python3*/site-packages || true
  echo "$want" > "$stamp"
  log "Python environment ready: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)')"
fi
