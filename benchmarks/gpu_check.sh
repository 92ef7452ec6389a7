#!/usr/bin/env bash
# Every CUDA path of the suite on one GPU, the main job first, in parts, each in this order:
#   compare          `python compare.py` as the README gives it (only --out and --run_timeout added): the
#                    modes a GPU runs by default; its report, CSV and pictures kept, its wall time in the summary
#   verify           `compare.py --verify` and `compare.py --verify --deterministic` side by side, every mode
#                    (fsdp too), NCCL only, on a small model: two one-rank NCCL groups, each under torch's
#                    launcher with a free port of its own (--standalone) and in a folder of its own
#   fast             fast_path.sh's default eager row (benchmarks/fast.py single_gpu)
#   compiled_cold    fast_path.sh's compiled and graphed row, on an empty compile cache
#   compiled_warm    the same on the cache compiled_cold wrote (KEEP/compile_cache)
#   memory_snapshot  `fsdp/train.py --memory_snapshot 3` as docs/speed.md gives it, its file read back
#   tests            the GPU tests (tests/gpu), compare.py's columns read from compare's comparison
#   fast_path_rest   the fast-path table's other rows (the plain single_gpu/train.py among them) and the two
#                    profiles
#   compare_repeat   `compare.py --repeat 3`, every mode, NCCL only
# A lease of a GPU comes as calls of at most 10 minutes, so the parts come in two calls, the second run at
# once on the still-warm machine:
#   CALL=1   compare verify fast compiled_cold
#   CALL=2   compiled_warm and what call 1 skipped or left unfinished, then memory_snapshot tests
#            fast_path_rest compare_repeat, as its DEADLINE_S allows (every call in the order above)
# (PARTS="..." picks parts instead; neither: every part.) What call 2 needs of call 1 lies in KEEP (default
# runs/gpu_check in the repository, which the device machine keeps between calls; OUT is emptied): the
# compile cache, call 1's fast-path rows and the parts it left. CALL=1 empties those first.
# DEADLINE_S (default 540; 0: none): a part that would end past DEADLINE_S seconds from the start, by its
# predicted minutes, is skipped and named in the summary. It prints its plan first: each part with the
# minutes predicted for it on one H200, when it should end, and which call holds it.
# Every part streams into OUT as it goes, so a stop keeps every part and row that finished and the running
# part's output: straight under OUT, at most 8 files, each written whole as soon as it is known:
#   summary.md        the plan, then each part's outcome, time and command as it ends, then its tables, then
#                     the lines for BENCHMARKS.md (written however the check ends)
#   gpu_check.log     everything the check and its parts print, as they print it
#   environment.txt   nvidia-smi, its topology, the versions
#   fast_path.md      the fast-path table, written again after every row
#   compare_report.md, compare_results.csv   compare's report.md and results.csv
#   verify.md         both verifications' verdicts
#   logs.tar.gz       OUT/work/parts/ packed after every part: each part's log, every run's log and
#                     results.json, the pictures, the reports (the profilers' traces, the weights and
#                     the memory snapshot left out: their sizes are in the summary)
# The parts work in OUT/work/parts/<part>/ and log into OUT/work/parts/logs/<part>.log: none of their files
# lies less than three folders down, so OUT and the two levels below it hold only the 8 files above.
# Each part is a process group of its own (benchmarks/jobs.sh): Ctrl-C, SIGTERM, SIGHUP or a `timeout`
# stops the running part whole (SIGTERM, then SIGKILL after JOB_GRACE_S + 5 seconds: fast_path.sh's rows
# get JOB_GRACE_S, default 10 here, to stop first), nothing the check started outlives it, and within 30 s
# of the signal everything finished is packed and the summary ends with its lines for BENCHMARKS.md,
# naming the part stopped. A part that runs past twice its predicted minutes plus two is stopped and named
# failed; each compare.py run past its --run_timeout likewise (the report names it).
#
#   PYTHONUNBUFFERED=1 CALL=1 timeout -s TERM -k 30 560 bash benchmarks/gpu_check.sh OUT   (docs/speed.md)
#   PARTS="tests compare_repeat" COMPARE_ARGS="--repeat 3" bash benchmarks/gpu_check.sh OUT
#
# VERIFY_ARGS replaces --verify's model and data (default: PyramidNet-20 alpha=48 on 4,096 images);
# BENCHMARK_STEPS goes to fast_path.sh (default 50 timed steps a row); COMPARE_ARGS replaces compare_repeat's
# arguments. A part that fails is named in the summary, the others still run, and the exit status is 1 (a
# part skipped is no failure). Without CUDA it says so in one line, exit 2.
#
# The minutes predicted, on one H200 (an H100 alike but for its slower steps), from BENCHMARKS.md:
# - Measured: the default eager step 54.7 ms at batch 256 (4,679 images/s), the compiled and graphed one
#   38.2 ms (6,700 images/s) after a 109 s cold compile (H200; the H100's compile, without CUDA graphs,
#   150 s); fast_path.sh's 9 rows and 2 profiles of 30 untimed and 50 timed steps in 384 s, of which the
#   steps take about 60 s: about 30 s a process beyond its steps, the table written after it included
#   (H100; the H200's 235 s for fast, unaligned, compiled_cold and part of compiled_warm fit about 30 s
#   too); tests/gpu in 78 s (H100). Those rows ran the fast path inside train.py, which benchmarks/fast.py
#   runs now with the same defaults (not yet timed there). The table then computed the roofline's bounds
#   each time it was written, about 13 s (an estimate, never timed alone there; 21.7 s on a busy 2-core CPU); it now
#   computes a bound once and keeps it (a table then takes 0.2 s).
# - So S = 20 s for a PyramidNet-110 process beyond its steps (imports, CUDA, the synthetic images, cuDNN's
#   autotuning, results.json): the 30 s less the table's 13 s, plus a little, the images it generates now
#   fewer (only those its steps draw: 14,464 for compare.py's runs, 20,480 for a fast-path row; assumed:
#   a train.py generates its 50,000 and 10,000 synthetic images again now, a second or two on the CPU,
#   within the little).
#   Assumed, not measured: a step at compare.py's batch 128 about 31 ms (128 / 4,679 images/s, plus 15 %
#   for a smaller batch); 5 s a run for its 3 profiled steps and their trace; 5 s more for a run torchrun
#   starts; 15 s of compare.py's own (its start, the projection, the pictures; 5 s on a 2-core CPU for the
#   tiny model); 12 s for a process of PyramidNet-20 on 4,096 images (S without most of the images'
#   generation and autotuning), 18 s under torchrun; two --verify runs side by side on 16 cores and a GPU
#   their small model leaves mostly idle 10 % slower than one alone; the warm compile 30 s (the target,
#   now that AOTAutograd's cache keeps PyramidNet's graphs: BENCHMARKS.md); 3 s for fast_path.sh's own
#   start (its CUDA check) in each part that runs it.
# - compare: single_gpu, data_parallel, dist_parallel over NCCL and over Gloo, 10 + 100 + 3 steps each:
#   4 x (20 + 113 x 0.031 + 5) + 2 x 5 + 15 = 139 s, 2.3 min.
# - verify: 10 runs each (4 training, 2 first halves, 2 resumed, 2 evaluations; 6 through torch's launcher):
#   4 x 12 + 6 x 18 + 15 = 171 s alone; --deterministic's 3.0 min (its slower kernels), side by side
#   3.3 min.
# - fast 3 + 20 + 80 x 0.0547 + 13 (the first bound) = 40 s, 0.7 min; compiled_cold 3 + 20 + 109 + 80 x
#   0.0382 + 1 = 136 s, 2.3 min (on an H100, with its 150 s, 3.0); compiled_warm 3 + 20 + 30 + 3 + 1 = 57 s,
#   1.0 min.
# - So call 1 ends at about 8.8 minutes with its start (0.2), inside DEADLINE_S's 9.0: a margin of 0.2.
#   Where compare or verify take longer (their runs were never timed on a GPU), compiled_cold is skipped
#   and call 2 runs it before compiled_warm.
# - memory_snapshot 0.7 (one fsdp process under torchrun, S + 5 s, its 10 + 5 steps, the first 3 recorded
#   with a stack per allocation, symbolized with TORCH_SYMBOLIZE_MODE=fast, and the file read back: about
#   40 s); tests 2.5 (78 s, and the tests added since: the fast path's three runs, one of them compiled beside
#   the plain compiled run, assumed 30 s more); fast_path_rest 4.9 (8 processes of 21 s and their
#   80 steps, 52 s, the 2 profiles at 30 s each, width8's bound 13 s, and fast_path.sh's start: 296 s);
#   compare_repeat 6.0 (12 runs of 20 + 43 x 0.031 + 5 s, 6 under torchrun, and 15 s: 361 s). fast_path_rest
#   has a ninth row since (plain: the lesson's single_gpu/train.py, 21 s and its 80 steps, 4 s) and two
#   bounds more (the plain model's at bf16 and at fp32, classic's, 13 s each): 296 + 25 + 26 = 347 s, 5.8.
set -uo pipefail
OUT=${1:?usage: bash benchmarks/gpu_check.sh OUT}
[[ $OUT == /* ]] || OUT=$PWD/$OUT  # where it was started from
KEEP=${KEEP:-}
[ -z "$KEEP" ] || [[ $KEEP == /* ]] || KEEP=$PWD/$KEEP
cd "$(dirname "$0")/.." || exit 1
KEEP=${KEEP:-$PWD/runs/gpu_check}
ORDER="compare verify fast compiled_cold compiled_warm memory_snapshot tests fast_path_rest compare_repeat"
CALL_1="compare verify fast compiled_cold"
CALL_2="compiled_warm memory_snapshot tests fast_path_rest compare_repeat"  # and what call 1 left
CALL=${CALL:-}
DEADLINE_S=${DEADLINE_S:-540}
refuse() { echo "error: $*" >&2; exit 2; }
[ -z "$CALL" ] || [ -z "${PARTS:-}" ] || refuse "give CALL or PARTS, not both: CALL picks its own parts"
[[ $CALL =~ ^[12]?$ ]] || refuse "CALL is 1 or 2, not $CALL: 1 holds $CALL_1; 2 the rest"
[[ $DEADLINE_S =~ ^[0-9]+$ ]] || refuse "DEADLINE_S is whole seconds from the start (0: none), not $DEADLINE_S"
for name in ${PARTS:-}; do
    [[ " $ORDER " == *" $name "* ]] || refuse "PARTS names $name, which is no part: choose among $ORDER"
done
if ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    refuse "no CUDA GPU here: gpu_check.sh runs on a GPU machine (the CPU suite is python -m pytest -q)"
fi
[ -z "$(ls -A "$OUT" 2>/dev/null)" ] || refuse "$OUT already holds files: give a new or empty folder"
LEFT_BY_1=  # the parts call 1 skipped or left unfinished, for call 2
case $CALL in
    1) PARTS=$CALL_1 ;;
    2) LEFT_BY_1=$(cat "$KEEP/call_1.left" 2>/dev/null)
       PARTS="$CALL_2 $LEFT_BY_1" ;;
    *) PARTS=${PARTS:-$ORDER} ;;
esac
WORK=$OUT/work/parts
mkdir -p "$WORK/logs" "$KEEP" || exit 1
if [ "$CALL" = 1 ]; then  # what an earlier call 1 left would pass for this one's
    rm -rf "$KEEP/compile_cache" "$KEEP/fast_path" "$KEEP/call_1.left"
fi
SUMMARY=$OUT/summary.md
exec > >(trap '' INT TERM HUP; exec tee -p -a "$OUT/gpu_check.log") 2>&1  # deaf to stops, and to a reader that quits
TEE=$!

JOB_GRACE_S=${JOB_GRACE_S:-10}  # a stop's budget is 30 s: the part's end, then the pack and the summary
# shellcheck source=benchmarks/jobs.sh
. benchmarks/jobs.sh
ROW_GRACE_S=$JOB_GRACE_S  # fast_path.sh's, to stop its row, before this script stops fast_path.sh
JOB_GRACE_S=$((ROW_GRACE_S + 5))

ALL_MODES="single_gpu data_parallel dist_parallel fsdp"
# --verify's runs on a GPU default to the full PyramidNet-110 on 50,000 images, evaluated whole by every run: the
# deterministic half alone outlasted the 5.5 minutes left to it on an H200. A smaller model checks the same paths.
VERIFY_ARGS=${VERIFY_ARGS:---depth 20 --alpha 48 --synthetic_size 4096}
COMPARE_ARGS=${COMPARE_ARGS:---repeat 3 --modes $ALL_MODES --backends nccl --benchmark_steps 30}
BENCHMARK_STEPS=${BENCHMARK_STEPS:-50}
LATER_ROWS="unaligned plain classic data_parallel dist_parallel align16 align32 cudnn_limit0 width8 profile"
# a run's time limit: three to six times its predicted time (a PyramidNet-110 run of compare.py 40 s, a
# --verify run 12-18 s, the compiled_cold row 142 s; an H100 compiled for 151 s)
COMPARE_RUN_TIMEOUT=180
VERIFY_RUN_TIMEOUT=90
ROW_TIMEOUT=420
# the minutes predicted for each part, in tenths (the header says how), and what each runs
declare -A TENTHS=([compare]=23 [verify]=33 [fast]=7 [compiled_cold]=23 [compiled_warm]=10 [memory_snapshot]=7
                   [tests]=25 [fast_path_rest]=58 [compare_repeat]=60)
START_TENTHS=2
declare -A WHAT=(
    [compare]="python compare.py: 4 runs of PyramidNet-110 alpha=270"
    [verify]="compare.py --verify, and --verify --deterministic beside it: 10 runs each of a small model"
    [fast]="fast_path.sh's fast row: the default eager step ($BENCHMARK_STEPS timed steps)"
    [compiled_cold]="fast_path.sh's compiled_cold row: compiled and graphed, an empty compile cache"
    [compiled_warm]="fast_path.sh's compiled_warm row, on the cache compiled_cold wrote in KEEP"
    [memory_snapshot]="fsdp/train.py --memory_snapshot 3: the allocator's history, read back"
    [tests]="python -m pytest tests/gpu"
    [fast_path_rest]="fast_path.sh: the other 9 rows and 2 profiles"
    [compare_repeat]="compare.py $COMPARE_ARGS")
FAILED=()
SKIPPED=()
DONE=()         # the parts that ran to their end, passed or failed
CURRENT=        # the part running, for the summary if the check is stopped
STOPPED_BY=     # the signal that stopped the check
PART_STARTED=0

minutes() { printf '%d.%d' $(($1 / 10)) $(($1 % 10)); }
wanted() { [[ " $PARTS " == *" $1 "* ]]; }
past_deadline() { [ "$DEADLINE_S" -gt 0 ] && [ "$1" -gt "$DEADLINE_S" ]; }  # past_deadline SECONDS
fits() { ! past_deadline $((SECONDS + TENTHS[$1] * 6)); }  # fits PART: it would end by DEADLINE_S if started now

plan() {  # the parts this call runs, in order, with their predicted minutes and when each should end
    local name ends=$START_TENTHS
    echo "Plan${CALL:+ of call $CALL (CALL=$CALL)}: the minutes predicted on one H200" \
         "(benchmarks/gpu_check.sh's header says how); DEADLINE_S=$DEADLINE_S"
    printf '  %-21s %7s %7s  %s\n' part minutes "ends at" what
    printf '  %-21s %7s %7s  %s\n' start "$(minutes $START_TENTHS)" "$(minutes $START_TENTHS)" \
        "the GPU check, nvidia-smi, the versions"
    for name in $ORDER; do
        wanted "$name" || continue
        if past_deadline $(((ends + TENTHS[$name]) * 6)); then
            printf '  %-21s %7s %7s  %s\n' "$name" "$(minutes "${TENTHS[$name]}")" - \
                "past DEADLINE_S by the plan (it would end at $(minutes $((ends + TENTHS[$name])))):\
 skipped unless the parts before it end sooner"
            continue
        fi
        ends=$((ends + TENTHS[$name]))
        printf '  %-21s %7s %7s  %s\n' "$name" "$(minutes "${TENTHS[$name]}")" "$(minutes $ends)" \
            "${WHAT[$name]}"
    done
    echo "Call 1 (CALL=1) holds $CALL_1; call 2 (CALL=2, at once after it, on the same machine) holds"
    echo "  $CALL_2 and what call 1 skipped or left unfinished, as its DEADLINE_S allows; this call:" \
         "$([ -n "$CALL" ] && echo "CALL=$CALL" || echo "PARTS=\"$PARTS\"")"
    if [ "$CALL" = 2 ]; then
        echo "Call 1 left: ${LEFT_BY_1:-nothing}$([ -f "$KEEP/call_1.left" ] || echo " (no record in $KEEP)")"
        echo "The compile cache $KEEP/compile_cache holds $(graphs) compiled graphs$([ "$(graphs)" -gt 0 ] \
            || echo ": compiled_warm would compile cold")"
    fi
}

graphs() {  # the compiled graphs in the compile cache a compile reads (benchmarks/fast.py, graph_entries)
    find "$KEEP/compile_cache" \( -path '*/fxgraph/*/*/*' -o -path '*/aotautograd/*/*' \) -type f \
        ! -name '.*' 2>/dev/null | wc -l
}

logged() {  # logged LOG COMMAND...: COMMAND's output into LOG and on; LOG's writer outlives a stop
    local log=$1
    shift
    "$@" 2>&1 | (trap '' INT TERM HUP; exec tee -p -a "$log")
    return "${PIPESTATUS[0]}"
}

part() {  # part NAME COMMAND...: the part as a job of its own, its outcome and time into the summary;
    # skipped where it would end past DEADLINE_S. SHOWN, if set, is the command the summary gives.
    local name=$1 code outcome=ok
    shift
    local shown=${SHOWN:-$*} limit=$(((TENTHS[$name] * 2 + 20) * 6))  # twice the prediction, and two minutes
    if ! fits "$name"; then
        SKIPPED+=("$name")
        echo "== $name: SKIPPED: predicted $(minutes "${TENTHS[$name]}") min, it would end at" \
             "$((SECONDS + TENTHS[$name] * 6)) s, past DEADLINE_S=$DEADLINE_S"
        echo "- $name: SKIPPED (predicted $(minutes "${TENTHS[$name]}") min at $SECONDS s: past" \
             "DEADLINE_S=$DEADLINE_S): \`$shown\`" >> "$SUMMARY"
        return 1
    fi
    CURRENT=$name PART_STARTED=$SECONDS
    echo "== $name (predicted $(minutes "${TENTHS[$name]}") min, stopped after $limit s): $shown"
    job_run "$limit" logged "$WORK/logs/$name.log" "$@"
    code=$?
    [ $code -eq 0 ] || { outcome="FAILED (exit $code)"; FAILED+=("$name"); }
    [ $code -ne 124 ] || outcome="FAILED (stopped at its limit, $limit s)"
    echo "- $name: $outcome in $((SECONDS - PART_STARTED)) s (predicted $(minutes "${TENTHS[$name]}")" \
         "min): \`$shown\`" >> "$SUMMARY"
    CURRENT=
    DONE+=("$name")
    pack
    return $code
}

pack() {  # OUT/work/parts as it stands into OUT/logs.tar.gz, written whole
    # a file of this process's own: two parts side by side may pack at once; tar's 1 is a file
    # that changed while it was read (a part still writing its log), the archive still whole
    local packed="$WORK/logs/.packed.$BASHPID" code
    tar czf "$packed" -C "$WORK" --exclude='./logs/.packed.*' --exclude='trace_rank*.json' \
        --exclude='*.pt' --exclude='*.pickle' --exclude=.compile_cache . 2>/dev/null
    code=$?
    if [ $code -le 1 ]; then mv "$packed" "$OUT/logs.tar.gz"; else rm -f "$packed"; fi
}

left() {  # the parts of this call that did not run to their end: skipped, stopped or never reached
    local name
    for name in $ORDER; do
        wanted "$name" && [[ " ${DONE[*]} " != *" $name "* ]] && echo "$name"
    done | paste -sd ' ' -
}

finish() {  # the summary's end, however the check ends: the outcome and the lines for BENCHMARKS.md
    local unfinished
    unfinished=$(left)
    [ "$CALL" != 1 ] || echo "$unfinished" > "$KEEP/call_1.left"  # for call 2
    { echo
      if [ ${#FAILED[@]} -gt 0 ]; then
          echo "FAILED: ${FAILED[*]}"
      elif [ -z "$STOPPED_BY" ]; then
          echo "every part that ran passed"
      fi
      [ -z "$STOPPED_BY" ] || echo "STOPPED by $STOPPED_BY${STOPPED_PART:+ during $STOPPED_PART}"
      [ ${#SKIPPED[@]} -eq 0 ] || echo "skipped, past DEADLINE_S=$DEADLINE_S: ${SKIPPED[*]}"
      [ -z "$unfinished" ] || [ "$CALL" != 1 ] || echo "left for call 2 (CALL=2): $unfinished"
      echo; echo "## For BENCHMARKS.md"; echo; echo "$DEVICE"
      echo "gpu_check.sh ${CALL:+CALL=$CALL }DEADLINE_S=$DEADLINE_S: ran ${DONE[*]:-nothing} in $SECONDS s$(
          [ -z "$unfinished" ] || echo " (not run to its end: $unfinished)")"
      grep -m1 " runs in " "$WORK/compare/report.md" 2>/dev/null | sed 's/^/compare: /'
      verdict verify "--verify"
      verdict verify_deterministic "--verify --deterministic"
      grep -v "^ \|^  \|top kernels" "$OUT/fast_path.md" 2>/dev/null | grep -B2 -A20 "^| run" | head -24
    } >> "$SUMMARY"
}
verdict() {  # verdict FOLDER LABEL: a --verify run's verdict and time
    [ -f "$WORK/$1/verify.md" ] || return 0
    grep -hE "^passed|^FAILED" "$WORK/$1/verify.md" | sed "s/^/$2: /"
    grep -m1 -o "[0-9]* runs in [^:]*" "$WORK/$1/verify.md" | sed "s/^/$2: /"
}

ending() {  # on the way out, however: a part under way stopped whole, then what finished packed
    STOPPED_PART=$CURRENT
    if [ -n "$CURRENT" ]; then
        local by=${STOPPED_BY:-an error in gpu_check.sh}
        STOPPED_BY=$by
        echo "- $CURRENT: STOPPED by $by after $((SECONDS - PART_STARTED)) s" >> "$SUMMARY"
        echo "gpu_check.sh: stopped by $by during $CURRENT; what it measured so far: $SUMMARY"
    fi
    job_stop
    [ -z "$CURRENT" ] || pack
    finish
    cat "$SUMMARY"
    exec >&- 2>&-
    wait "$TEE"  # the log's last lines
}
STOPPED_PART=
trap ending EXIT
trap 'STOPPED_BY=SIGINT; exit 130' INT
trap 'STOPPED_BY=SIGTERM; exit 143' TERM
trap 'STOPPED_BY=SIGHUP; exit 129' HUP

verify_table() {  # verify_table FOLDER TITLE: a --verify run's table and verdict, into the summary and verify.md
    [ -f "$1/verify.md" ] || return 0
    { echo "## $2"; grep -E "^\||^passed|^FAILED" "$1/verify.md"; echo; } | tee -a "$OUT/verify.md" >> "$SUMMARY"
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
verify_both() {  # the two --verify runs side by side, each line marked with its run; the first failure's status
    local plain deterministic code=0 second
    # shellcheck disable=SC2086
    (python compare.py --verify --modes $ALL_MODES --backends nccl $VERIFY_ARGS \
         --run_timeout $VERIFY_RUN_TIMEOUT --out "$WORK/verify" 2>&1 | sed -u 's/^/[verify] /'
     exit "${PIPESTATUS[0]}") &
    plain=$!
    # shellcheck disable=SC2086
    (python compare.py --verify --deterministic --modes $ALL_MODES --backends nccl $VERIFY_ARGS \
         --run_timeout $VERIFY_RUN_TIMEOUT --out "$WORK/verify_deterministic" 2>&1 \
         | sed -u 's/^/[deterministic] /'
     exit "${PIPESTATUS[0]}") &
    deterministic=$!
    wait "$plain" || code=$?
    wait "$deterministic"
    second=$?
    [ "$code" -ne 0 ] || code=$second
    return "$code"
}
fast_path_rows() {  # fast_path_rows PART ROWS: fast_path.sh's rows into OUT/fast_path.md, a row at a time,
    # the compiled rows on the compile cache in KEEP; call 1's rows kept in KEEP for call 2's table
    local code
    part "$1" env BENCHMARK_STEPS="$BENCHMARK_STEPS" ROWS="$2" ROW_TIMEOUT=$ROW_TIMEOUT \
        JOB_GRACE_S="$ROW_GRACE_S" SUMMARY="$OUT/fast_path.md" COMPILE_CACHE="$KEEP/compile_cache" \
        bash benchmarks/fast_path.sh "$WORK/fast_path"
    code=$?
    [ "$CALL" != 1 ] || (cd "$WORK/fast_path" && cp --parents ./*/results.json .bounds.json \
                             "$KEEP/fast_path/") 2>/dev/null
    return $code
}
fast_path_table() {  # fast_path_table TITLE: the fast-path table as it stands, into the summary
    [ -f "$OUT/fast_path.md" ] || return 0
    { echo "## $1"; cat "$OUT/fast_path.md"; echo; } >> "$SUMMARY"
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
mkdir -p "$WORK/fast_path" "$KEEP/fast_path"
[ "$CALL" != 2 ] || cp -r "$KEEP/fast_path/." "$WORK/fast_path/"  # call 1's rows: one table for both calls

# ------------------------------------------------------------------------------------------ the parts
if wanted compare; then
    part compare python compare.py --out "$WORK/compare" --run_timeout $COMPARE_RUN_TIMEOUT
    cp "$WORK/compare/report.md" "$OUT/compare_report.md" 2>/dev/null
    cp "$WORK/compare/results.csv" "$OUT/compare_results.csv" 2>/dev/null
    compare_table "$WORK/compare" "python compare.py"
fi
if wanted verify; then  # how far the modes are with the GPU's own kernels, and bitwise with --deterministic
    SHOWN="python compare.py --verify --modes $ALL_MODES --backends nccl $VERIFY_ARGS --run_timeout \
$VERIFY_RUN_TIMEOUT --out $WORK/verify, and beside it the same with --deterministic" part verify verify_both
    verify_table "$WORK/verify" "compare.py --verify"
    verify_table "$WORK/verify_deterministic" "compare.py --verify --deterministic"
fi
if wanted fast; then
    fast_path_rows fast fast
fi
if wanted compiled_cold; then
    ! fits compiled_cold || rm -rf "$KEEP/compile_cache"  # cold: nothing an earlier compile left
    fast_path_rows compiled_cold compiled_cold
fi
if wanted compiled_warm; then
    fast_path_rows compiled_warm compiled_warm
fi
if wanted fast || wanted compiled_cold || wanted compiled_warm; then
    fast_path_table "Fast path (PyramidNet-110 alpha=270, batch 256)"
fi
if wanted memory_snapshot; then  # docs/speed.md's command on a real GPU, and what its file holds
    # TORCH_SYMBOLIZE_MODE=fast: the stacks' C++ frames named by torch itself (addr2line took minutes)
    part memory_snapshot env TORCH_SYMBOLIZE_MODE=fast python fsdp/train.py --benchmark --benchmark_steps 5 \
        --memory_snapshot 3 --log_dir "$WORK/memory_snapshot" --run_name memory_snapshot \
        && snapshot_read "$WORK/memory_snapshot/memory_snapshot/memory_snapshot.pickle"
fi
if wanted tests; then
    # -o addopts: one process (the GPU tests start their runs side by side themselves); the comparison's
    # test reads compare's, or runs a small one of its own
    given=()
    [ -f "$WORK/compare/results.csv" ] && given=(GPU_CHECK_COMPARE="$WORK/compare")
    part tests env "${given[@]}" python -m pytest -q -o addopts= -rA tests/gpu -p no:cacheprovider
    { echo "## Tests"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$WORK/logs/tests.log" | tail -40
      echo; } >> "$SUMMARY"
fi
if wanted fast_path_rest; then  # the rest of the table, and the profiles of the default step and of width8
    fast_path_rows fast_path_rest "$LATER_ROWS"
    fast_path_table "Fast path, every row"
    grep -A12 "operator self time" "$WORK/logs/fast_path_rest.log" >> "$SUMMARY" 2>/dev/null
fi
if wanted compare_repeat; then
    # shellcheck disable=SC2086
    part compare_repeat python compare.py $COMPARE_ARGS --run_timeout $COMPARE_RUN_TIMEOUT \
        --out "$WORK/compare_repeat"
    compare_table "$WORK/compare_repeat" "compare.py $COMPARE_ARGS"
fi
[ ${#FAILED[@]} -eq 0 ]  # the exit status; the summary's end is written on the way out (ending)
