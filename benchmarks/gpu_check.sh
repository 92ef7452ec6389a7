#!/usr/bin/env bash
# Every CUDA path of the suite on one GPU, in one go, the figures first. Within its first 8 minutes on an H100 or
# H200: the fast-path table's headline rows (benchmarks/fast_path.sh: the default aligned step, the unaligned and
# classic ones, the compiled+graphed step cold and then warm on the cache the cold run wrote, data_parallel and
# dist_parallel on the one GPU, --align_channels 16), then compare.py --verify. After them: the table's other rows
# and the profiles, --verify --deterministic, the GPU tests (tests/gpu) and compare.py --repeat 3. Each part's
# outcome and tables go into the summary as soon as it ends, so a run cut off by a time limit keeps what it
# measured; the output ends with the table to paste into BENCHMARKS.md. At most 8 files straight under OUT:
#   summary.md  for_benchmarks.md  fast_path.md  tests.log  compare_report.md  compare_results.csv
#   environment.txt  logs.tar.gz (every run's log and results.json, the profiles, the plots)
#
#   PYTHONUNBUFFERED=1 bash benchmarks/gpu_check.sh OUT
#   PARTS="tests compare" COMPARE_ARGS="--repeat 3 --backends nccl" bash benchmarks/gpu_check.sh OUT
#
# PARTS picks the parts (default: fast_path verify tests compare); VERIFY_ARGS replaces --verify's model and data
# (default: PyramidNet-20 alpha=48 on 4,096 images); BENCHMARK_STEPS goes to fast_path.sh (here 50 timed steps);
# COMPARE_ARGS replaces compare.py's arguments (default: --repeat 3 --benchmark_steps 30 and every mode, fsdp
# included). A part that fails is named in the summary, the others still run, and the exit status is 1.
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

# The rows the first minutes measure, the headline first: the default (aligned) step, the unaligned and the
# classic ones, the compiled+graphed step cold then warm (one fast_path.sh call: the warm run reads the cache the
# cold one wrote), then the modes on the one GPU and --align_channels 16. Each call adds its rows to one table.
FIRST_ROWS=("fast unaligned classic" "compiled_cold compiled_warm" "data_parallel dist_parallel align16")
LATER_ROWS="align32 cudnn_limit0 width8 profile"
fast_path_rows() {  # fast_path_rows PART ROWS: one fast_path.sh call into the shared table
    part "$1" "$WORK/fast_path.log" env BENCHMARK_STEPS="${BENCHMARK_STEPS:-50}" ROWS="$2" \
        bash benchmarks/fast_path.sh "$WORK/fast_path"
    cp "$WORK/fast_path/summary.txt" "$OUT/fast_path.md" 2>/dev/null
}
if wanted fast_path; then
    for rows in "${FIRST_ROWS[@]}"; do
        fast_path_rows "fast_path ($rows)" "$rows"
    done
    { echo "## Fast path (PyramidNet-110 alpha=270, batch 256)"; cat "$OUT/fast_path.md"; echo; } >> "$SUMMARY"
fi
if wanted verify; then  # --verify on the GPU: how far the modes are without --deterministic (the default)
    # every mode, fsdp too (compare.py leaves it out by default on one GPU)
    # shellcheck disable=SC2086
    part verify "$WORK/verify.log" python compare.py --verify --modes $ALL_MODES $VERIFY_ARGS --out "$WORK/verify"
    verify_table "$WORK/verify" "compare.py --verify"
fi
if wanted fast_path; then  # the rest of the table, and the profiles of the default step and of width8
    fast_path_rows "fast_path ($LATER_ROWS)" "$LATER_ROWS"
    grep -A60 "operator self time" "$WORK/fast_path.log" | head -80 >> "$OUT/fast_path.md"
    { echo "## Fast path, every row"; grep -B3 "^|" "$OUT/fast_path.md" | head -24; echo; } >> "$SUMMARY"
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
{ echo; echo "## For BENCHMARKS.md"; echo; head -3 "$SUMMARY" | tail -2  # the device, torch, CUDA and commit
  grep -v "^ \|^  \|top kernels" "$OUT/fast_path.md" 2>/dev/null | grep -B2 -A20 "^| run" | head -24
  for folder in verify verify_det; do grep -hE "^passed|^FAILED" "$WORK/$folder/verify.md" 2>/dev/null; done
} | tee "$OUT/for_benchmarks.md"
[ ${#FAILED[@]} -eq 0 ]
