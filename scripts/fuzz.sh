#!/usr/bin/env bash
# Fuzzes whittle's readers with libFuzzer: scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]
# (`make fuzz FUZZ_SECONDS=N [FUZZ_TARGETS="checkpoint recipe"]`). Each target starts from its
# committed seeds (tests/fuzz/corpus/<target>) and grows a working corpus under
# BUILD_DIR/fuzz/corpus/<target>, kept between runs, so repeated runs add up. A crash, leak,
# sanitizer report, timeout (10 s an input) or allocation past 2 GiB writes its input to
# BUILD_DIR/fuzz/artifacts/<target>/ and fails the run. One line per target is appended to
# BUILD_DIR/fuzz/summary.txt: seconds, executions, corpus size, findings.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?build directory}
seconds=${2:?seconds per target}
shift 2
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(checkpoint graph_json recipe idx cifar10 hdf5_dataset image_archive image)
fi
# A malloc that cannot be met returns NULL, as it does outside the sanitizer: libhdf5 asks for what a
# damaged file declares and reports the failure (operator new still aborts with a report).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1"
root="$build/fuzz"
mkdir -p "$root"
failed=()
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/fuzz_$t"
  [ -x "$bin" ] || { echo "[fuzz] no fuzz target $bin (build with make fuzz-build)" >&2; exit 2; }
  corpus="$root/corpus/$t"
  artifacts="$root/artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  log="$root/$t.log"
  echo "[fuzz] $t: ${seconds} s (log $log)"
  set +e
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts" "$corpus" "tests/fuzz/corpus/$t" > "$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  # A reader that forks a child first (the HDF5 dataset reader) has libFuzzer's crash handler in the
  # child too: a crash contained there saves its input as well, while the parent goes on. The
  # parent's exit status is the verdict; the saved inputs are counted for a look.
  found=$(ls "$artifacts" | wc -l)
  line="$(date -u +%Y-%m-%dT%H:%M:%SZ) $t: ${seconds} s, ${execs:-?} executions, corpus $(ls "$corpus" | wc -l) files, exit $rc, inputs saved $found"
  echo "[fuzz] $line"
  echo "$line" >> "$root/summary.txt"
  if ((rc != 0)); then failed+=("$t"); tail -40 "$log" >&2; fi
done
if ((${#failed[@]})); then
  echo "[fuzz] findings in: ${failed[*]} (inputs under $root/artifacts/)" >&2
  exit 1
fi
