#!/usr/bin/env bash
# Installs whittle from the build tree into a scratch prefix and builds examples/ against the
# installed package with find_package(whittle), then runs the example.
set -euo pipefail
src=$1; build=$2; python=$3
prefix="$build/install-test"
rm -rf "$prefix" "$build/examples-test"
cmake --install "$build" --prefix "$prefix" >/dev/null
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src/examples" -B "$build/examples-test" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" >/dev/null
cmake --build "$build/examples-test" -j 2
"$build/examples-test/graph_basics"
"$build/examples-test/prune_model" resnet20 "$build/examples-test/resnet20_pruned.h5"
"$build/examples-test/distill_model" 5
"$build/examples-test/train_qat" "$src/data/mnist10k" 60 dorefa "$build/examples-test/lenet5_qat.h5"
"$build/examples-test/export_model" "$build/examples-test/lenet5_qat.h5" "$build/examples-test/lenet5_qat.onnx" "$build/examples-test/lenet5_qat.pt"
# Data parallel from a user's loop: 2 ranks through the .venv's torchrun on Gloo.
# The port is drawn below the kernel's ephemeral range (which outgoing connections take from), and
# checked by binding it.
port=$("$python" -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(100):
    p = random.randrange(10000, max(10001, low))
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    print(p)
    break
else:
    raise SystemExit("no free port below the ephemeral range in 100 draws")')
OMP_NUM_THREADS=1 "$(dirname "$python")/torchrun" --no-python --nproc-per-node=2 --master-port="$port" \
  "$build/examples-test/train_ddp" "$src/data/mnist10k" 1 "$build/examples-test/lenet5_ddp.h5"
test -s "$build/examples-test/lenet5_ddp.h5"
