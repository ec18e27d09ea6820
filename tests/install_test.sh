#!/usr/bin/env bash
# Installs whittle from the build tree into a scratch prefix and builds examples/ against the
# installed package with find_package(whittle), then runs the example.
set -euo pipefail
src=$1; build=$2; python=$3
prefix="$build/install-test"
rm -rf "$prefix" "$build/examples-test"
cmake --install "$build" --prefix "$prefix" >/dev/null
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
# ccache with paths relative to the checkout (as the main build's launcher), so that a fresh clone
# in another folder reuses the cache: the examples, the installed headers and LibTorch's all lie
# under it.
launcher=()
if command -v ccache >/dev/null; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$src;CCACHE_NOHASHDIR=1;ccache")
fi
# lld links LibTorch's programs several times faster than GNU ld (the main build uses it too).
if command -v ld.lld >/dev/null; then
  launcher+=("-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld")
fi
cmake -S "$src/examples" -B "$build/examples-test" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" >/dev/null
cmake --build "$build/examples-test" -j 2
"$build/examples-test/graph_basics"
"$build/examples-test/prune_model" resnet20 "$build/examples-test/resnet20_pruned.h5"
"$build/examples-test/distill_model" 5
"$build/examples-test/train_qat" "$src/data/mnist10k" 60 dorefa "$build/examples-test/lenet5_qat.h5"
"$build/examples-test/calibrate_int8" "$src/data/mnist10k" 200 percentile "$build/examples-test/lenet5_int8.h5"
"$build/examples-test/export_model" "$build/examples-test/lenet5_qat.h5" "$build/examples-test/lenet5_qat.onnx" "$build/examples-test/lenet5_qat.pt"
# Data parallel from a user's loop: 2 ranks through the .venv's torchrun on Gloo.
# The port is drawn outside the kernel's ephemeral range (which outgoing connections take from),
# on its wider side, and checked by binding it; without room there, the kernel picks one.
port=$("$python" -c '
import random, socket
def bind(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        return s.getsockname()[1]
    except OSError:
        return 0
    finally:
        s.close()
try:
    low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
except (OSError, ValueError):
    low, high = 32768, 60999
first, last = (1024, low - 1) if low - 1024 >= 65535 - high else (high + 1, 65535)
port = 0
if last - first >= 1000:
    for _ in range(100):
        port = bind(random.randint(first, last))
        if port:
            break
print(port or bind(0))')
OMP_NUM_THREADS=1 "$(dirname "$python")/torchrun" --no-python --nproc-per-node=2 --master-port="$port" \
  "$build/examples-test/train_ddp" "$src/data/mnist10k" 1 "$build/examples-test/lenet5_ddp.h5"
test -s "$build/examples-test/lenet5_ddp.h5"
