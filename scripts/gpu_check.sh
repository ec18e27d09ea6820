#!/usr/bin/env bash
# The CUDA checks of whittle's own kernels, in one run on a GPU machine that has CUDA 13 and the
# same LibTorch (the torch 2.11 CUDA wheel) but none of whittle's build dependencies.
#
#   scripts/gpu_check.sh pack [BUILD]   here: copies the CUDA test and benchmark programs of BUILD
#                                       (default build/, configured with WHITTLE_CUDA=ON) and the two
#                                       shared libraries they need beyond LibTorch (libcudart,
#                                       Google Benchmark) into .gpu/, a folder git ignores
#   scripts/gpu_check.sh run [OUT]      there, from the repository root with .gpu/ beside it: runs
#                                       the CUDA kernel tests (kernels, fused quantizers), then the
#                                       CUDA benchmarks (binary convolution against cuDNN float and
#                                       half, QAT training steps), writing logs and JSON to OUT
#                                       (default gpu-results/); LibTorch is the one of the machine's
#                                       python3. About 5 minutes on an H200.
#
# The programs link whittle statically; LibTorch, libcudart and the C++ runtime come from the
# machine. Exit status: that of the tests (the benchmarks are reported, not judged).
set -uo pipefail

mode=${1:-}
case "$mode" in
  pack)
    build=${2:-build}
    progs=("$build/tests/kernels_cuda_test" "$build/tests/fused_quantizers_test" "$build/bench/bench_kernels"
           "$build/bench/bench_qat")
    for p in "${progs[@]}"; do
      [[ -x "$p" ]] || { echo "gpu_check.sh: $p is missing: build it first (cmake --build $build)" >&2; exit 2; }
    done
    grep -q "WHITTLE_CUDA:BOOL=ON" "$build/CMakeCache.txt" ||
      { echo "gpu_check.sh: $build is not configured with WHITTLE_CUDA=ON" >&2; exit 2; }
    rm -rf .gpu && mkdir -p .gpu/lib
    cp "${progs[@]}" .gpu/
    for lib in libcudart.so.13 libbenchmark.so.1debian; do
      path=$(ldd "$build/bench/bench_kernels" | awk -v l="$lib" '$1 == l {print $3}')
      [[ -n "$path" ]] && cp -L "$path" .gpu/lib/
    done
    exclude=$(git rev-parse --git-path info/exclude)
    grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
    du -sh .gpu
    echo "carry .gpu and run: scripts/gpu_check.sh run \$OUT"
    ;;
  run)
    out=${2:-gpu-results}
    mkdir -p "$out"
    torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') ||
      { echo "gpu_check.sh: python3 has no torch" >&2; exit 2; }
    export LD_LIBRARY_PATH="$torch_lib:$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
    # Built on Debian 12 (glibc 2.36, GCC 12's libstdc++): an older system cannot load them.
    missing=$(ldd .gpu/kernels_cuda_test .gpu/bench_kernels | grep "not found")  # no early grep exit under pipefail
    if [[ -n "$missing" ]]; then
      echo "$missing" | tee "$out/missing_libraries.txt" >&2
      exit 2
    fi
    status=0
    .gpu/kernels_cuda_test --gtest_brief=1 2>&1 | tee "$out/kernels_cuda_test.log" || status=1
    .gpu/fused_quantizers_test --gtest_filter='FusedQuantizersCuda.*:FusedQuantizers.Cuda*' --gtest_brief=1 2>&1 |
      tee "$out/fused_quantizers_test.log" || status=1
    .gpu/bench_kernels --benchmark_filter=Cuda --benchmark_min_time=0.5 --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true --benchmark_out="$out/bench_kernels.json" 2>&1 | tee "$out/bench_kernels.log"
    # fused = 1: whittle's CUDA quantizer kernels (turned on here); fused = 0: the ATen-op quantizers.
    WHITTLE_FUSED_QUANTIZERS_CUDA=1 .gpu/bench_qat --benchmark_filter='BM_TrainStepCuda/.*/.*/[01]/0' \
      --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_out="$out/bench_qat_cuda.json" 2>&1 | tee "$out/bench_qat_cuda.log"
    exit $status
    ;;
  *)
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
