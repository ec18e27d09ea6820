#!/usr/bin/env bash
# The full 160-epoch CIFAR-10 ResNet-20 recipes (FP32, recipes/cifar10/resnet20.yaml, and DoReFa
# W2A2 from scratch, resnet20_dorefa_w2a2.yaml) on a GPU machine that has the same LibTorch (the
# torch 2.11 CUDA wheel) in its python3 but none of whittle's build dependencies, within a time
# limit per call: a run cut short by the limit saves its state, comes back, and the next call
# resumes it.
#
#   scripts/gpu_cifar160.sh pack [BUILD] [STATE]  here: puts BUILD's whittle (default build/) with
#                                       the shared libraries it needs beyond LibTorch and glibc
#                                       (xz-compressed, about 23 MB) and the CIFAR-10 archive of
#                                       ../shared/data into .gpu160/, a folder git ignores; with
#                                       STATE, the runs to carry on: the <recipe>.tar files a
#                                       previous call brought back, or the <recipe>/ folders
#                                       `record` wrote (docs/results/cifar10_gpu160/, for a later
#                                       sitting)
#   scripts/gpu_cifar160.sh run OUT [SECONDS]  there, from the repository root with .gpu160/
#                                       beside it: trains each recipe not yet finished, in order,
#                                       until SECONDS (default 540) have passed, then writes each
#                                       run's directory as OUT/<recipe>.tar (checkpoint, metrics,
#                                       report, and the training state while unfinished), its log
#                                       as OUT/<recipe>.log, and the GPU's name as OUT/gpu.txt
#   scripts/gpu_cifar160.sh record DIR [DEST]  here: unpacks the <recipe>.tar files of DIR into
#                                       DEST/<recipe>/ (default docs/results/cifar10_gpu160/): a
#                                       finished run's model.h5, metrics.jsonl, recipe.yaml and
#                                       report.json, an unfinished one's train_state.pt,
#                                       metrics.jsonl and recipe.yaml; prints where each stands
#
# Environment for `run`: WHITTLE_GPU160_RECIPES (default "resnet20 resnet20_dorefa_w2a2"),
# WHITTLE_GPU160_DEVICE (default cuda; cpu tries the script on any machine), WHITTLE_GPU160_SET
# (more `--set key=value` overrides, space-separated, for every recipe). The CUDA quantizer kernels
# stay off (the ATen-op forms run) unless WHITTLE_FUSED_QUANTIZERS_CUDA=1 is set.
# Exit status of `run`: 0 when every run finished or stopped at the time limit with its state
# saved, 1 when one failed (its log says why), 2 on a usage or setup error. Of `record`: 1 when an
# archive holds fewer epochs than the run recorded in DEST (it is not replaced), 2 on bad input (a
# DEST that is not a folder, an archive tar cannot read, a metrics.jsonl line that is not a JSON
# object with a numeric epoch and test_top1): every archive is checked before DEST changes.
set -uo pipefail

die() { echo "gpu_cifar160.sh: $*" >&2; exit 2; }
# The number of epochs a run's metrics.jsonl records: its lines that are JSON objects with a numeric
# epoch and test_top1 (0 when it has none). With a second argument, the archive it came from, any
# other non-empty line is an error: one line naming the archive, file and line, exit status 2.
epochs_in() {
  python3 - "$@" <<'EOF'
import json, math, sys
path, archive = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
try:
    lines = open(path, "rb").read().splitlines()
except FileNotFoundError:
    lines = []
except OSError as e:  # a folder, say: an error in an archive, no epochs elsewhere
    if archive:
        sys.exit(f"gpu_cifar160.sh: {archive}: cannot read metrics.jsonl ({e.strerror})")
    lines = []
n = 0
for i, line in enumerate(lines, 1):
    if not line.strip():
        continue
    try:
        m = json.loads(line)
    except ValueError:  # UnicodeDecodeError included
        m = None
    if isinstance(m, dict) and num(m.get("epoch")) and num(m.get("test_top1")):
        n += 1
    elif archive:
        sys.exit(f"gpu_cifar160.sh: {archive}: metrics.jsonl line {i} is not an epoch's metrics "
                 "(a JSON object with a numeric epoch and test_top1)")
print(n)
EOF
}
archive=../shared/data/cifar10-jpeg/cifar10-jpeg.tar.gz

mode=${1:-}
case "$mode" in
  pack)
    build=${2:-build}
    state=${3:-}
    [[ -x "$build/whittle" ]] || die "$build/whittle is missing: build it first (ninja -C $build whittle)"
    [[ -f "$archive" ]] || die "no CIFAR-10 archive at $archive"
    tmp=$(mktemp -d) || die "no temporary folder"
    trap 'rm -rf "$tmp"' EXIT
    # The state is gathered before .gpu160 is replaced: STATE may lie inside it.
    mkdir -p "$tmp/state" "$tmp/bin" || die "no temporary folder"
    if [[ -n "$state" ]]; then
      [[ -d "$state" ]] || die "state folder $state does not exist"
      for t in "$state"/*.tar; do [[ -f "$t" ]] && { cp "$t" "$tmp/state/" || die "cannot copy $t"; }; done
      for d in "$state"/*/; do
        [[ -f "$d/train_state.pt" || -f "$d/report.json" ]] || continue
        tar -C "$d" -cf "$tmp/state/$(basename "$d").tar" . || die "cannot archive $d"
      done
      compgen -G "$tmp/state/*.tar" >/dev/null ||
        die "state folder $state holds no <recipe>.tar and no <recipe>/ with train_state.pt or report.json"
    fi
    cp "$build/whittle" "$tmp/bin/"
    # Every library the loader resolves outside LibTorch, except glibc's and the C++ runtime, which
    # come from the machine (built on Debian 12: glibc 2.36 and GCC 12's libstdc++ or later there).
    ldd "$build/whittle" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
      grep -v -E '^(libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s)\.so' |
      grep -v -E '/(torch|nvidia)/' | while read -r name path; do cp -L "$path" "$tmp/bin/$name"; done
    rm -rf .gpu160 && mkdir -p .gpu160 || die "cannot create .gpu160"
    # xz -1: 23 MB in 9 s here; -6 saves 3 MB for 45 s.
    tar -C "$tmp/bin" -cf - . | xz -1 -T0 >.gpu160/whittle.tar.xz || die "packing the binary failed"
    cp "$archive" .gpu160/ || die "cannot copy $archive"
    if [[ -n "$state" ]]; then
      cp -r "$tmp/state" .gpu160/state || die "cannot copy the state"
      for t in .gpu160/state/*.tar; do echo "carrying on $(basename "$t" .tar)"; done
    fi
    if exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then
      grep -qx '/.gpu160/' "$exclude" 2>/dev/null || echo '/.gpu160/' >>"$exclude"
    fi
    du -sh .gpu160
    echo "carry .gpu160 and run: scripts/gpu_cifar160.sh run \$OUT 540"
    ;;
  run)
    out=${2:-}
    [[ -n "$out" ]] || die "run needs an output folder"
    limit=${3:-540}
    [[ "$limit" =~ ^[0-9]+$ ]] || die "SECONDS must be a whole number, not '$limit'"
    # The device runs a command for 600 s at most; whittle is killed 60 s after the limit at worst.
    ((limit <= 540)) || die "SECONDS is at most 540 (the device's 600 s a command, less a minute to stop), not $limit"
    [[ -f .gpu160/whittle.tar.xz ]] || die ".gpu160/whittle.tar.xz is missing: run 'scripts/gpu_cifar160.sh pack' here first and carry .gpu160"
    start=$(date +%s)
    mkdir -p "$out" || die "cannot create $out"
    # Fixed paths: a resumed run's effective recipe (its pack_to) is the one it started with.
    bin=/tmp/whittle-gpu160
    rm -rf "$bin" && mkdir -p "$bin" || die "cannot create $bin"
    # Python's tarfile reads xz: the machine need not have xz-utils.
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .gpu160/whittle.tar.xz "$bin" ||
      die "unpacking .gpu160/whittle.tar.xz failed"
    torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') ||
      die "python3 has no torch"
    export LD_LIBRARY_PATH="$torch_lib:$bin:${LD_LIBRARY_PATH:-}"
    missing=$(ldd "$bin/whittle" | grep "not found")  # grep reads it all: no early exit under pipefail
    if [[ -n "$missing" ]]; then
      echo "$missing" | tee "$out/missing_libraries.txt" >&2
      exit 2
    fi
    device=${WHITTLE_GPU160_DEVICE:-cuda}
    if [[ "$device" == cuda* ]]; then
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
    else
      echo "device $device" >"$out/gpu.txt"
    fi
    read -r -a extra <<<"${WHITTLE_GPU160_SET:-}"
    sets=(--set "data.train=.gpu160/cifar10-jpeg.tar.gz" --set "data.test=.gpu160/cifar10-jpeg.tar.gz"
          --set "data.pack_to=/tmp/whittle-gpu160-cache" --set "data.num_workers=8")
    for s in "${extra[@]}"; do sets+=(--set "$s"); done
    status=0
    for stem in ${WHITTLE_GPU160_RECIPES:-resnet20 resnet20_dorefa_w2a2}; do
      recipe=recipes/cifar10/$stem.yaml
      [[ -f "$recipe" ]] || { echo "gpu_cifar160.sh: no recipe $recipe" >&2; status=1; continue; }
      run_dir=runs/gpu160/$stem
      rm -rf "$run_dir" && mkdir -p "$run_dir"
      [[ -f ".gpu160/state/$stem.tar" ]] && tar -C "$run_dir" -xf ".gpu160/state/$stem.tar"
      log="$out/$stem.log"
      left=$((limit - ($(date +%s) - start) - 30))  # 30 s to save the state and write the archives
      if [[ -f "$run_dir/report.json" ]]; then
        echo "$stem: finished in an earlier call" | tee "$log"
      elif ((left < 60)); then
        echo "$stem: not started in this call ($left s left of $limit)" | tee "$log"
      else
        resume=()
        if [[ -f "$run_dir/train_state.pt" ]]; then
          resume=(--resume)
          echo "$stem: carrying on after epoch $(epochs_in "$run_dir/metrics.jsonl")" | tee "$log"
        else
          echo "$stem: starting at epoch 1" | tee "$log"
        fi
        # SIGTERM: whittle finishes the batch, saves its state and exits; KILL a minute later.
        timeout --signal=TERM --kill-after=60 "$left" "$bin/whittle" run "$recipe" --device "$device" \
          --out "$run_dir" "${resume[@]}" "${sets[@]}" >>"$log" 2>&1
        rc=$?
        if [[ -f "$run_dir/report.json" ]]; then
          echo "$stem: finished" | tee -a "$log"
        elif [[ -f "$run_dir/train_state.pt" ]] && ((rc == 124 || rc == 130)); then
          echo "$stem: stopped at the time limit, state saved (resume it in the next call)" | tee -a "$log"
        else
          echo "$stem: failed (exit status $rc)" | tee -a "$log"
          status=1
        fi
      fi
      # Whatever the run dir holds goes back, a run not started in this call included.
      if [[ -n "$(ls -A "$run_dir")" ]]; then tar -C "$run_dir" -cf "$out/$stem.tar" . || status=1; fi
    done
    rm -rf "$bin"
    exit $status
    ;;
  record)
    dir=${2:-}
    dest=${3:-docs/results/cifar10_gpu160}
    [[ -d "$dir" ]] || die "record needs the folder the run's files came back to"
    compgen -G "$dir/*.tar" >/dev/null || die "$dir holds no <recipe>.tar"
    [[ -e "$dest" && ! -d "$dest" ]] && die "DEST $dest is not a folder"
    tmp=$(mktemp -d) || die "no temporary folder"
    trap 'rm -rf "$tmp"' EXIT
    # Every archive is unpacked and checked before DEST changes: one that is unreadable or holds a
    # bad metrics line stops the record with nothing recorded. (A run neither finished nor
    # resumable, or with fewer epochs than DEST's, is then skipped with a message; the rest are
    # recorded.)
    stems=()
    for t in "$dir"/*.tar; do
      stem=$(basename "$t" .tar)
      mkdir "$tmp/$stem" || die "no temporary folder"
      tar -C "$tmp/$stem" -xf "$t" 2>/dev/null || die "$t is not a readable tar archive"
      epochs_in "$tmp/$stem/metrics.jsonl" "$t" >"$tmp/$stem.epochs" || exit 2
      stems+=("$stem")
    done
    mkdir -p "$dest" 2>/dev/null && [[ -w "$dest" ]] || die "cannot write to DEST $dest"
    status=0
    for stem in "${stems[@]}"; do
      t="$dir/$stem.tar"
      unpacked=$tmp/$stem
      if [[ -f "$unpacked/report.json" ]]; then
        keep=(model.h5 metrics.jsonl recipe.yaml report.json)
      elif [[ -f "$unpacked/train_state.pt" ]]; then
        keep=(train_state.pt metrics.jsonl recipe.yaml)
      else
        echo "$stem: neither finished nor resumable (no report.json, no train_state.pt): not recorded" >&2
        continue
      fi
      new_epochs=$(<"$tmp/$stem.epochs")
      old_epochs=$(epochs_in "$dest/$stem/metrics.jsonl")
      if ((new_epochs < old_epochs)); then
        echo "$stem: $t holds $new_epochs epochs, $dest/$stem $old_epochs: not replaced (was the state carried?)" >&2
        status=1
        continue
      fi
      # Copied beside the recorded run first, then swapped in: no half-written DEST/<recipe>.
      staged="$dest/.$stem.new"
      rm -rf "$staged" && mkdir "$staged" || die "cannot write to $dest"
      for f in "${keep[@]}"; do
        [[ -f "$unpacked/$f" ]] || continue
        cp "$unpacked/$f" "$staged/" || { rm -rf "$staged"; die "cannot copy $f into $dest"; }
      done
      rm -rf "${dest:?}/$stem" && mv "$staged" "$dest/$stem" || die "cannot replace $dest/$stem"
      python3 - "$dest/$stem" <<'EOF'
import json, os, sys
d = sys.argv[1]
lines = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()] if os.path.exists(os.path.join(d, "metrics.jsonl")) else []
done = os.path.exists(os.path.join(d, "report.json"))
last = lines[-1] if lines else None
where = f"epoch {last['epoch']}, test top-1 {100 * last['test_top1']:.2f} %" if last else "no epoch finished"
print(f"{os.path.basename(d)}: {'finished' if done else 'unfinished'}, {where} -> {d}")
EOF
    done
    exit $status
    ;;
  *)
    sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
