#!/usr/bin/env bash
# Every CUDA path of the suite on one GPU, in one go, the main job first:
#   1. compare         `python compare.py` as the README gives it (only --out and --run_timeout added): the
#                      modes a GPU runs by default; its report, CSV and pictures kept, its wall time in the
#                      summary
#   2. verify          `compare.py --verify`, every mode (fsdp too), NCCL only, on a small model
#   3. fast_path       the headline speed rows of benchmarks/fast_path.sh: the default eager step, then the
#                      compiled and graphed step cold and warm (on the cache the cold run wrote)
#   then, each as PARTS picks them:
#   4. tests           the GPU tests (tests/gpu), compare.py's columns read from part 1's comparison
#   5. memory_snapshot `fsdp/train.py --memory_snapshot 3` as docs/speed.md gives it, its file read back
#   6. fast_path_rest  the fast-path table's other rows and the two profiles
#   7. verify_deterministic   `compare.py --verify --deterministic`, as part 2
#   8. compare_repeat  `compare.py --repeat 3`, every mode, NCCL only
# It prints its plan first: each part with the minutes predicted for it on one H200 and when it should end.
# Every part streams into OUT as it goes, so a time limit keeps every part and row that finished and the
# running part's output: straight under OUT, at most 8 files, each written whole as soon as it is known:
#   summary.md        the plan, then each part's outcome, time and command as it ends, then its tables
#   gpu_check.log     everything the check and its parts print, as they print it
#   environment.txt   nvidia-smi, its topology, the versions
#   fast_path.md      the fast-path table, written again after every row
#   compare_report.md, compare_results.csv   part 1's report.md and results.csv
#   verify.md         part 2's verdicts
#   logs.tar.gz       OUT/work/parts/ packed after every part: each part's log, every run's log and
#                     results.json, the pictures, the reports (the profilers' traces, the weights and
#                     the memory snapshot left out: their sizes are in the summary)
# The parts work in OUT/work/parts/<part>/ and log into OUT/work/parts/logs/<part>.log: none of their files
# lies less than three folders down, so OUT and the two levels below it hold only the 8 files above.
# Each part is a process group of its own (benchmarks/jobs.sh): Ctrl-C, SIGTERM, SIGHUP or a `timeout`
# stops the running part (SIGTERM, then SIGKILL after JOB_GRACE_S + 10 seconds: fast_path.sh's rows get
# JOB_GRACE_S, default 20, to stop first) and nothing the check started outlives it; the summary names the
# part stopped. A part that runs past twice its predicted minutes plus two is stopped and named failed; each
# compare.py run past its --run_timeout likewise (the report names it).
#
#   PYTHONUNBUFFERED=1 bash benchmarks/gpu_check.sh OUT
#   PARTS="tests compare_repeat" COMPARE_ARGS="--repeat 3" bash benchmarks/gpu_check.sh OUT
#
# PARTS picks the parts (default: all eight, always in the order above); VERIFY_ARGS replaces --verify's model
# and data (default: PyramidNet-20 alpha=48 on 4,096 images); BENCHMARK_STEPS goes to fast_path.sh (default
# 50 timed steps a row); COMPARE_ARGS replaces compare_repeat's arguments. A part that fails is named in
# the summary, the others still run, and the exit status is 1. Without CUDA it says so in one line, exit 2.
#
# The minutes predicted, on one H200 (an H100 alike but for its slower steps), from BENCHMARKS.md:
# - Measured: the default eager step 54.7 ms at batch 256 (4,679 images/s), the compiled and graphed one
#   38.2 ms (6,700 images/s) after a 109 s cold compile (H200); fast_path.sh's 9 rows and 2 profiles of 30
#   untimed and 50 timed steps in 384 s, of which the steps take about 60 s: about 30 s a process beyond
#   its steps (H100; the H200's 235 s for fast, unaligned, compiled_cold and part of compiled_warm fit
#   about 30 s too); tests/gpu in 78 s (H100).
# - So S = 30 s for a PyramidNet-110 process beyond its steps (imports, CUDA, the 60,000 synthetic images,
#   cuDNN's autotuning, results.json) when those were measured; a --benchmark run now generates only the
#   images its steps draw (steps x batch: 14,464 for compare.py's runs, 20,480 for a fast-path row), about
#   10 s less, so S = 20 s here. Assumed, not measured: a step at compare.py's batch 128 about 31 ms
#   (128 / 4,679 images/s, plus 15 % for a smaller batch); 5 s a run for its 3 profiled steps and their
#   trace; 5 s more for a run torchrun starts; 15 s of compare.py's own (its start, the projection, the
#   pictures; 5 s on a 2-core CPU for the tiny model); 12 s for a process of PyramidNet-20 on 4,096
#   images (S without most of the images' generation and autotuning), 18 s under torchrun; the warm
#   compile 30 s; 3 s for fast_path.sh's table after each row.
# - compare: single_gpu, data_parallel, dist_parallel over NCCL and over Gloo, 10 + 100 + 3 steps each:
#   4 x (20 + 113 x 0.031 + 5) + 2 x 5 + 15 = 139 s, 2.3 min.
# - verify: 10 runs (4 training, 2 first halves, 2 resumed, 2 evaluations; 6 through torch's launcher):
#   4 x 12 + 6 x 18 + 15 = 171 s, 2.9 min.
# - fast_path: fast 20 + 80 x 0.0547 = 24 s, compiled_cold 20 + 109 + 80 x 0.0382 = 132 s, compiled_warm
#   20 + 30 + 3 = 53 s, tables 9 s: 218 s, 3.6 min.
# - So the first three end at about 9.0 minutes (with 0.2 for the start).
# - tests 2.0 (78 s, and the tests added since); memory_snapshot 0.7 (one fsdp process under torchrun,
#   S + 5 s, its 10 + 5 steps, the first 3 recorded with a stack per allocation, and the file read back:
#   about 40 s); fast_path_rest 4.8 (9 processes of 20 s and their steps, the 2 profiles at 30 s each,
#   10 tables: 286 s); verify_deterministic 3.0 (verify's runs); compare_repeat 6.0 (12 runs of
#   20 + 43 x 0.031 + 5 s, 6 under torchrun, and 15 s: 361 s).
set -uo pipefail
OUT=${1:?usage: bash benchmarks/gpu_check.sh OUT}
[[ $OUT == /* ]] || OUT=$PWD/$OUT  # where it was started from
cd "$(dirname "$0")/.." || exit 1
ORDER="compare verify fast_path tests memory_snapshot fast_path_rest verify_deterministic compare_repeat"
PARTS=${PARTS:-$ORDER}
for name in $PARTS; do
    if [[ " $ORDER " != *" $name "* ]]; then
        echo "error: PARTS names $name, which is no part: choose among $ORDER" >&2
        exit 2
    fi
done
if ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "error: no CUDA GPU here: gpu_check.sh runs on a GPU machine (the CPU suite is python -m pytest -q)" >&2
    exit 2
fi
if [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
    echo "error: $OUT already holds files: give a new or empty folder" >&2
    exit 2
fi
WORK=$OUT/work/parts
mkdir -p "$WORK/logs" || exit 1
SUMMARY=$OUT/summary.md
exec > >(trap '' INT TERM HUP; exec tee -p -a "$OUT/gpu_check.log") 2>&1  # deaf to stops, and to a reader that quits
TEE=$!

# shellcheck source=benchmarks/jobs.sh
. benchmarks/jobs.sh
ROW_GRACE_S=$JOB_GRACE_S  # fast_path.sh's, to stop its row, before this script stops fast_path.sh
JOB_GRACE_S=$((ROW_GRACE_S + 10))

ALL_MODES="single_gpu data_parallel dist_parallel fsdp"
# --verify's runs on a GPU default to the full PyramidNet-110 on 50,000 images, evaluated whole by every run: the
# deterministic half alone outlasted the 5.5 minutes left to it on an H200. A smaller model checks the same paths.
VERIFY_ARGS=${VERIFY_ARGS:---depth 20 --alpha 48 --synthetic_size 4096}
COMPARE_ARGS=${COMPARE_ARGS:---repeat 3 --modes $ALL_MODES --backends nccl --benchmark_steps 30}
BENCHMARK_STEPS=${BENCHMARK_STEPS:-50}
FIRST_ROWS="fast compiled_cold compiled_warm"
LATER_ROWS="unaligned classic data_parallel dist_parallel align16 align32 cudnn_limit0 width8 profile"
# a run's time limit: three to six times its predicted time (a PyramidNet-110 run of compare.py 40 s, a
# --verify run 12-18 s, the compiled_cold row 142 s; an H100 compiled for 151 s)
COMPARE_RUN_TIMEOUT=180
VERIFY_RUN_TIMEOUT=90
ROW_TIMEOUT=420
# the minutes predicted for each part, in tenths (the header says how), and what each runs
declare -A TENTHS=([compare]=23 [verify]=29 [fast_path]=36 [tests]=20 [memory_snapshot]=7
                   [fast_path_rest]=48 [verify_deterministic]=30 [compare_repeat]=60)
START_TENTHS=2
declare -A WHAT=(
    [compare]="python compare.py: 4 runs of PyramidNet-110 alpha=270"
    [verify]="compare.py --verify, every mode, NCCL only: 10 runs of a small model"
    [fast_path]="fast_path.sh: $FIRST_ROWS ($BENCHMARK_STEPS timed steps)"
    [tests]="python -m pytest tests/gpu"
    [memory_snapshot]="fsdp/train.py --memory_snapshot 3: the allocator's history, read back"
    [fast_path_rest]="fast_path.sh: the other 8 rows and 2 profiles"
    [verify_deterministic]="compare.py --verify --deterministic, as verify"
    [compare_repeat]="compare.py $COMPARE_ARGS")
FAILED=()
CURRENT=        # the part running, for the summary if the check is stopped
STOPPED_BY=     # the signal that stopped the check
PART_STARTED=0

minutes() { printf '%d.%d' $(($1 / 10)) $(($1 % 10)); }
wanted() { [[ " $PARTS " == *" $1 "* ]]; }

plan() {  # the parts PARTS picks, in order, with their predicted minutes and when each should end
    local name ends=$START_TENTHS
    echo "Plan: the minutes predicted on one H200 (benchmarks/gpu_check.sh's header says how)"
    printf '  %-21s %7s %7s  %s\n' part minutes "ends at" what
    printf '  %-21s %7s %7s  %s\n' start "$(minutes $START_TENTHS)" "$(minutes $START_TENTHS)" \
        "the GPU check, nvidia-smi, the versions"
    for name in $ORDER; do
        wanted "$name" || continue
        ends=$((ends + TENTHS[$name]))
        printf '  %-21s %7s %7s  %s\n' "$name" "$(minutes "${TENTHS[$name]}")" "$(minutes $ends)" \
            "${WHAT[$name]}"
    done
}

logged() {  # logged LOG COMMAND...: COMMAND's output into LOG and on; LOG's writer outlives a stop
    local log=$1
    shift
    "$@" 2>&1 | (trap '' INT TERM HUP; exec tee -p -a "$log")
    return "${PIPESTATUS[0]}"
}

part() {  # part NAME COMMAND...: the part as a job of its own, its outcome and time into the summary
    local name=$1 code outcome=ok
    shift
    local limit=$(((TENTHS[$name] * 2 + 20) * 6))  # seconds: twice the prediction, and two minutes
    CURRENT=$name PART_STARTED=$SECONDS
    echo "== $name (predicted $(minutes "${TENTHS[$name]}") min, stopped after $limit s): $*"
    job_run "$limit" logged "$WORK/logs/$name.log" "$@"
    code=$?
    [ $code -eq 0 ] || { outcome="FAILED (exit $code)"; FAILED+=("$name"); }
    [ $code -ne 124 ] || outcome="FAILED (stopped at its limit, $limit s)"
    echo "- $name: $outcome in $((SECONDS - PART_STARTED)) s (predicted $(minutes "${TENTHS[$name]}")" \
         "min): \`$*\`" >> "$SUMMARY"
    CURRENT=
    pack
    return $code
}

pack() {  # OUT/work/parts as it stands into OUT/logs.tar.gz, written whole
    tar czf "$WORK/logs/.packed" -C "$WORK" --exclude=./logs/.packed --exclude='trace_rank*.json' \
        --exclude='*.pt' --exclude='*.pickle' --exclude=.compile_cache . 2>/dev/null \
        && mv "$WORK/logs/.packed" "$OUT/logs.tar.gz"
}

stopped() {  # on the way out: a part under way stopped, and named so in the summary
    if [ -n "$CURRENT" ]; then
        local by=${STOPPED_BY:-an error in gpu_check.sh}
        echo "- $CURRENT: STOPPED by $by after $((SECONDS - PART_STARTED)) s" >> "$SUMMARY"
        echo "gpu_check.sh: stopped by $by during $CURRENT; what it measured so far: $SUMMARY"
    fi
    job_stop
    [ -z "$CURRENT" ] || pack
    exec >&- 2>&-
    wait "$TEE"  # the log's last lines
}
trap stopped EXIT
trap 'STOPPED_BY=SIGINT; exit 130' INT
trap 'STOPPED_BY=SIGTERM; exit 143' TERM
trap 'STOPPED_BY=SIGHUP; exit 129' HUP

verify_table() {  # verify_table FOLDER TITLE: a --verify run's table and verdict, into the summary
    [ -f "$1/verify.md" ] && { echo "## $2"; grep -E "^\||^passed|^FAILED" "$1/verify.md"; echo; } >> "$SUMMARY"
}
compare_table() {  # compare_table FOLDER TITLE: a comparison's wall time and table, into the summary
    [ -f "$1/report.md" ] || return 0
    { echo "## $2"; grep -m1 " runs in " "$1/report.md"; echo; grep "^|" "$1/report.md" | head -20; echo
    } >> "$SUMMARY"
}
snapshot_read() {  # snapshot_read FILE: the snapshot's size, segments and events into the summary
    { echo "## Memory snapshot (fsdp/train.py's first 3 steps, one GPU)"
      if [ -s "$1" ]; then
          echo "$(du -m "$1" | cut -f1) MB (left out of logs.tar.gz); torch.cuda._memory_viz stats:"
          python -W ignore::RuntimeWarning -m torch.cuda._memory_viz stats "$1" | grep -E "^(segments|total_)"
          python -c "import pickle, sys
events = [e for trace in pickle.load(open(sys.argv[1], 'rb'))['device_traces'] for e in trace]
print(len(events), 'events:', sum(e['action'] == 'alloc' for e in events), 'allocations,',
      sum(e['action'] == 'free_completed' for e in events), 'frees')" "$1"
      else
          echo "FAILED: no snapshot at $1"
          FAILED+=(memory_snapshot)
      fi
      echo; } >> "$SUMMARY" 2>&1
}
fast_path_rows() {  # fast_path_rows PART ROWS: fast_path.sh's rows into OUT/fast_path.md, a row at a time
    part "$1" env BENCHMARK_STEPS="$BENCHMARK_STEPS" ROWS="$2" ROW_TIMEOUT=$ROW_TIMEOUT \
        JOB_GRACE_S="$ROW_GRACE_S" SUMMARY="$OUT/fast_path.md" bash benchmarks/fast_path.sh "$WORK/fast_path"
}

# ------------------------------------------------------------------------------------------ the start
{ echo "# GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"; echo; echo "## Plan"; echo; plan; echo; } > "$SUMMARY"
plan
VERSIONS=$(python -c "import torch, torchvision; print(torch.cuda.get_device_name()); print('torch', \
torch.__version__, 'torchvision', torchvision.__version__, 'CUDA', torch.version.cuda, 'cuDNN', \
torch.backends.cudnn.version(), 'NCCL', '.'.join(map(str, torch.cuda.nccl.version())))" 2>&1 | tail -n 2)
{ nvidia-smi; nvidia-smi topo -m; echo "$VERSIONS"; echo "CPU cores: $(nproc)"; } > "$OUT/environment.txt" 2>&1
DEVICE="$(echo "$VERSIONS" | paste -sd ';' - | sed 's/;/; /')
commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null \
    || echo ' (with changes)')"  # the device, torch, CUDA and commit: in the summary's start and end
{ echo "## Parts"; echo; echo "$DEVICE"; echo; } >> "$SUMMARY"

# ------------------------------------------------------------------------------------------ the parts
if wanted compare; then
    part compare python compare.py --out "$WORK/compare" --run_timeout $COMPARE_RUN_TIMEOUT
    cp "$WORK/compare/report.md" "$OUT/compare_report.md" 2>/dev/null
    cp "$WORK/compare/results.csv" "$OUT/compare_results.csv" 2>/dev/null
    compare_table "$WORK/compare" "python compare.py"
fi
if wanted verify; then  # how far the modes are without --deterministic (the default)
    # shellcheck disable=SC2086
    part verify python compare.py --verify --modes $ALL_MODES --backends nccl $VERIFY_ARGS \
        --run_timeout $VERIFY_RUN_TIMEOUT --out "$WORK/verify"
    cp "$WORK/verify/verify.md" "$OUT/verify.md" 2>/dev/null
    verify_table "$WORK/verify" "compare.py --verify"
fi
if wanted fast_path; then
    fast_path_rows fast_path "$FIRST_ROWS"
    { echo "## Fast path (PyramidNet-110 alpha=270, batch 256)"; cat "$OUT/fast_path.md"; echo; } >> "$SUMMARY"
fi
if wanted tests; then
    # -o addopts: one process (the GPU tests start their runs side by side themselves); the comparison's
    # test reads part 1's, or runs a small one of its own
    given=()
    [ -f "$WORK/compare/results.csv" ] && given=(GPU_CHECK_COMPARE="$WORK/compare")
    part tests env "${given[@]}" python -m pytest -q -o addopts= -rA tests/gpu -p no:cacheprovider
    { echo "## Tests"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$WORK/logs/tests.log" | tail -40
      echo; } >> "$SUMMARY"
fi
if wanted memory_snapshot; then  # docs/speed.md's command on a real GPU, and what its file holds
    part memory_snapshot python fsdp/train.py --benchmark --benchmark_steps 5 --memory_snapshot 3 \
        --no_progress --log_dir "$WORK/memory_snapshot" --run_name memory_snapshot \
        && snapshot_read "$WORK/memory_snapshot/memory_snapshot/memory_snapshot.pickle"
fi
if wanted fast_path_rest; then  # the rest of the table, and the profiles of the default step and of width8
    fast_path_rows fast_path_rest "$LATER_ROWS"
    { echo "## Fast path, every row"; cat "$OUT/fast_path.md"; echo
      grep -A12 "operator self time" "$WORK/logs/fast_path_rest.log"; echo; } >> "$SUMMARY"
fi
if wanted verify_deterministic; then  # bitwise with --deterministic
    # shellcheck disable=SC2086
    part verify_deterministic python compare.py --verify --deterministic --modes $ALL_MODES --backends nccl \
        $VERIFY_ARGS --run_timeout $VERIFY_RUN_TIMEOUT --out "$WORK/verify_deterministic"
    verify_table "$WORK/verify_deterministic" "compare.py --verify --deterministic"
fi
if wanted compare_repeat; then
    # shellcheck disable=SC2086
    part compare_repeat python compare.py $COMPARE_ARGS --run_timeout $COMPARE_RUN_TIMEOUT \
        --out "$WORK/compare_repeat"
    compare_table "$WORK/compare_repeat" "compare.py $COMPARE_ARGS"
fi

# ------------------------------------------------------------------------------------------ the end
{ echo; [ ${#FAILED[@]} -eq 0 ] && echo "every part passed" || echo "FAILED: ${FAILED[*]}"
  echo; echo "## For BENCHMARKS.md"; echo; echo "$DEVICE"
  grep -v "^ \|^  \|top kernels" "$OUT/fast_path.md" 2>/dev/null | grep -B2 -A20 "^| run" | head -24
  for folder in verify verify_deterministic; do
      grep -hE "^passed|^FAILED" "$WORK/$folder/verify.md" 2>/dev/null
  done
  grep -m1 " runs in " "$WORK/compare/report.md" 2>/dev/null; } >> "$SUMMARY"
cat "$SUMMARY"
[ ${#FAILED[@]} -eq 0 ]
