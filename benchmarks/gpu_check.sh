#!/usr/bin/env bash
# Every CUDA path of the suite on one GPU, in one go, the figures first: the fast-path table with its profile and
# roofline (benchmarks/fast_path.sh: the aligned, unaligned, classic and compiled+graphed rows, the compile cold
# and warm), compare.py --verify without and with --deterministic (its tables in the summary), the GPU tests
# (tests/gpu) and compare.py --repeat 3. Each part's outcome and tables go into the summary as soon as it ends, so
# a run cut off by a time limit keeps what it measured. At most 8 files straight under OUT, the summary first:
#   summary.md  tests.log  fast_path.md  profile.json  compare_report.md  compare_results.csv  environment.txt
#   logs.tar.gz (every run's log and results.json, the plots)
#
#   PYTHONUNBUFFERED=1 bash benchmarks/gpu_check.sh OUT
#   PARTS="tests compare" COMPARE_ARGS="--repeat 3 --backends nccl" bash benchmarks/gpu_check.sh OUT
#
# In that order: fast_path's eager rows and profiles, --verify, fast_path's compiled+graphed rows (cold, then warm),
# --verify --deterministic, the GPU tests, compare.py. PARTS picks the parts (default: fast_path verify tests
# compare); VERIFY_ARGS replaces --verify's model and data (default: PyramidNet-20 alpha=48 on 4,096 images);
# BENCHMARK_STEPS goes to fast_path.sh (here 50 timed steps); COMPARE_ARGS replaces compare.py's arguments
# (default: --repeat 3 --benchmark_steps 30 and every mode, fsdp included). A part that fails is named in the
# summary, the others still run, and the exit status is 1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${1:?usage: bash benchmarks/gpu_check.sh OUT}
if ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "error: no CUDA GPU here: gpu_check.sh runs on a GPU machine (the CPU suite is python -m pytest -q)" >&2
    exit 2
fi
mkdir -p "$OUT"
WORK=$(mktemp -d)
PARTS=${PARTS:-fast_path verify tests compare}
# --verify's runs on a GPU default to the full PyramidNet-110 on 50,000 images, evaluated whole by every run: the
# deterministic half alone outlasted the 5.5 minutes left to it on an H200. A smaller model checks the same paths.
VERIFY_ARGS=${VERIFY_ARGS:---depth 20 --alpha 48 --synthetic_size 4096}
SUMMARY=$OUT/summary.md
ALL_MODES="single_gpu data_parallel dist_parallel fsdp"
FAILED=()

{ nvidia-smi; nvidia-smi topo -m; python -c "import torch, torchvision; print('torch', torch.__version__, \
'torchvision', torchvision.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version(), \
'NCCL', '.'.join(map(str, torch.cuda.nccl.version())))"; echo "CPU cores: $(nproc)"; } > "$OUT/environment.txt" 2>&1
{ echo "# GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"; echo
  echo "$(python -c "import torch; print(torch.cuda.get_device_name())"); $(grep '^torch ' "$OUT/environment.txt")"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with changes)')"
  echo "parts: $PARTS"; echo; } > "$SUMMARY"

part() {  # part NAME LOG COMMAND...: run it with its output to LOG, time it, add its outcome to the summary
    local name=$1 log=$2; shift 2
    local started=$SECONDS
    echo "== $name: $* (output: $log)"
    "$@" >> "$log" 2>&1
    local code=$?
    local outcome="ok"; [ $code -eq 0 ] || { outcome="FAILED (exit $code)"; FAILED+=("$name"); }
    echo "- $name: $outcome in $((SECONDS - started)) s: \`$*\`" >> "$SUMMARY"
    tar czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null  # after every part: a run cut off keeps its logs
}
wanted() { [[ " $PARTS " == *" $1 "* ]]; }
verify_table() {  # verify_table FOLDER TITLE: a --verify run's table and verdict, into the summary
    [ -f "$1/verify.md" ] && { echo "## $2"; grep -E "^\||^passed|^FAILED" "$1/verify.md"; echo; } >> "$SUMMARY"
}

EAGER_ROWS="fast unaligned align16 align32 cudnn_limit0 classic data_parallel dist_parallel width8 profile"
if wanted fast_path; then  # the eager rows and the profiles first; the compiled ones after --verify
    part fast_path "$WORK/fast_path.log" env BENCHMARK_STEPS="${BENCHMARK_STEPS:-50}" ROWS="$EAGER_ROWS" \
        bash benchmarks/fast_path.sh "$WORK/fast_path"
    cp "$WORK/fast_path/summary.txt" "$OUT/fast_path.md" 2>/dev/null
    cp "$WORK/fast_path/profile.json" "$OUT/profile.json" 2>/dev/null
    { echo "## Fast path (PyramidNet-110 alpha=270, batch 256)"; cat "$OUT/fast_path.md"; echo; } >> "$SUMMARY"
fi
if wanted verify; then  # --verify on the GPU: how far the modes are without --deterministic (the default)
    # every mode, fsdp too (compare.py leaves it out by default on one GPU)
    # shellcheck disable=SC2086
    part verify "$WORK/verify.log" python compare.py --verify --modes $ALL_MODES $VERIFY_ARGS --out "$WORK/verify"
    verify_table "$WORK/verify" "compare.py --verify"
fi
if wanted fast_path; then  # the compiled+graphed step, its compile cold then warm, added to the same table
    part fast_path_compiled "$WORK/fast_path.log" env BENCHMARK_STEPS="${BENCHMARK_STEPS:-50}" \
        ROWS="compiled_cold compiled_warm" bash benchmarks/fast_path.sh "$WORK/fast_path"
    cp "$WORK/fast_path/summary.txt" "$OUT/fast_path.md" 2>/dev/null
    grep -A60 "operator self time" "$WORK/fast_path.log" | head -80 >> "$OUT/fast_path.md"
    { echo "## Fast path with the compiled rows"; head -24 "$OUT/fast_path.md"; echo; } >> "$SUMMARY"
fi
if wanted verify; then  # bitwise with --deterministic
    # shellcheck disable=SC2086
    part verify_deterministic "$WORK/verify.log" python compare.py --verify --deterministic --modes $ALL_MODES \
        $VERIFY_ARGS --out "$WORK/verify_det"
    verify_table "$WORK/verify_det" "compare.py --verify --deterministic"
fi
if wanted tests; then  # the comparison's own test waits for compare.py below
    # -o addopts: one process (the GPU tests start their runs side by side themselves; no pytest-xdist needed)
    part tests "$OUT/tests.log" python -m pytest -q -o addopts= -rA tests/gpu -k "not compare_writes" \
        -p no:cacheprovider
    { echo; echo "## Tests"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/tests.log" | tail -40
      echo; } >> "$SUMMARY"
fi
if wanted compare; then
    # shellcheck disable=SC2086
    part compare "$WORK/compare.log" python compare.py \
        ${COMPARE_ARGS:---repeat 3 --benchmark_steps 30 --modes $ALL_MODES} \
        --out "$WORK/compare"
    cp "$WORK/compare/report.md" "$OUT/compare_report.md" 2>/dev/null
    cp "$WORK/compare/results.csv" "$OUT/compare_results.csv" 2>/dev/null
    [ -f "$OUT/compare_report.md" ] && { echo "## compare.py"; grep "^|" "$OUT/compare_report.md" | head -20
        echo; } >> "$SUMMARY"
    if wanted tests && [ -f "$WORK/compare/results.csv" ]; then
        part compare_test "$OUT/tests.log" env GPU_CHECK_COMPARE="$WORK/compare" python -m pytest -q \
            -o addopts= -rA tests/gpu -k compare_writes -p no:cacheprovider
    fi
fi

{ echo; [ ${#FAILED[@]} -eq 0 ] && echo "every part passed" || echo "FAILED: ${FAILED[*]}"; } >> "$SUMMARY"
tar czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
cat "$SUMMARY"
[ ${#FAILED[@]} -eq 0 ]
