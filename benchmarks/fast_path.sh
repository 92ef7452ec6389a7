#!/usr/bin/env bash
# The fast-path benchmark on one GPU: PyramidNet-110 alpha=270, global batch 256, every run in one go so the
# ratios compare runs on the same GPU. Results: OUT/<run>/results.json, OUT/profile*.json, OUT/summary.txt.
#   bash benchmarks/fast_path.sh [OUT [train.py flags for every run...]]     (default OUT: runs/fast_path)
#   BENCHMARK_STEPS=100 COMPILE=0 bash benchmarks/fast_path.sh ...    fewer timed steps; no compiled runs
# The rows: fast (`python benchmarks/fast.py single_gpu`: every default of the fast path on a GPU, bf16,
# channels_last, channels stored in multiples of 8, the gpu loader, the shortcut in place, fused SGD),
# unaligned (--align_channels 0), align16 and align32, cudnn_limit0 (cuDNN's autotuning tries every
# algorithm), plain (`python single_gpu/train.py` as the lesson is: bf16, channels_last, torchvision's
# DataLoader, the paper's channels), classic (plain in fp32 and NCHW), data_parallel and dist_parallel on the
# one GPU (fast.py's), width8 (--width_multiple 8, a wider model); with COMPILE=1 (the default)
# compiled_cold and compiled_warm (fast.py's --compile --compile_mode reduce-overhead: CUDA graphs; the first
# run with an empty compile cache, the second with the first's), and with COMPILE=all compiled (--compile,
# default mode) too. Their cache (fast.py's --compile_cache) is a temporary folder removed at the end, or
# COMPILE_CACHE=FOLDER, kept: a later call's compiled_warm row alone (ROWS=compiled_warm) then reads what an
# earlier call's compiled_cold wrote; compiled_cold refuses a COMPILE_CACHE that holds files already (it
# would not be cold), in one line, before anything is written. Then the profile of the fast path (by
# category, by convolution pass and stage, against the roofline) and of width8.
# ROWS="fast classic ... profile" runs only the rows named (and the profiles with "profile"); the summary covers
# every run under OUT, so a second call into the same OUT adds its rows to the first's table. The
# summary gives each row's images/s as a share of two of benchmarks/roofline.py's bounds for its own
# model: op by op (no kernel cost) and fused as training BatchNorm allows, each bound computed once for
# each model, GPU, precision and batch and kept in OUT/.bounds.json (a bound takes seconds: about 13 on
# the GPU machine by estimate, 21.7 on a busy 2-core CPU; the table without one, 0.2).
# The table is written again after every row (into SUMMARY, default OUT/summary.txt), so a run stopped
# part-way keeps every row it finished; it is printed at the end. Each row is a process group of its own
# (benchmarks/jobs.sh): Ctrl-C, SIGTERM, SIGHUP or a `timeout` stops the running row (SIGTERM, then SIGKILL
# after JOB_GRACE_S seconds, default 20) and nothing it started outlives the script. ROW_TIMEOUT=S stops a
# row after S seconds (default: no limit) and names it failed.
# A run that fails is named in the summary and the others still run; the exit status is then 1.
# Without a CUDA GPU it says so in one line and exits 2, before anything is written.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${1:-runs/fast_path}
VISIBLE=${CUDA_VISIBLE_DEVICES:-0}
export CUDA_VISIBLE_DEVICES=${VISIBLE%%,*}  # one GPU: the first visible one, for every run
if ! python -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "error: no CUDA GPU here (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES):" \
         "fast_path.sh measures one; on a CPU, python benchmarks/fast.py single_gpu --benchmark runs" >&2
    exit 2
fi
ROWS=${ROWS:-all}
wanted() { [ "$ROWS" = all ] || [[ " $ROWS " == *" $1 "* ]]; }
compiled_rows() {
    [ "${COMPILE:-1}" != 0 ] && { wanted compiled_cold || wanted compiled_warm || wanted compiled; }; }
if compiled_rows && wanted compiled_cold && [ -n "${COMPILE_CACHE:-}" ] \
        && [ -n "$(ls -A "$COMPILE_CACHE" 2>/dev/null)" ]; then
    echo "error: COMPILE_CACHE $COMPILE_CACHE already holds files, and compiled_cold compiles on an empty" \
         "cache: remove them, or give another folder" >&2
    exit 2
fi
mkdir -p "$OUT" || exit 1
SUMMARY=${SUMMARY:-$OUT/summary.txt}
ROW_TIMEOUT=${ROW_TIMEOUT:-0}
# shellcheck source=benchmarks/jobs.sh
. benchmarks/jobs.sh
CACHE=      # the compiled rows' compile cache
TEMPORARY=  # the same, when it is a temporary folder of this script's
trap 'job_stop; rm -rf "$TEMPORARY"' EXIT  # the running row stopped, and a temporary cache removed
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
STEPS=${BENCHMARK_STEPS:-200}
COMMON=(--benchmark --batch_size 256 --warmup_steps 30 --benchmark_steps "$STEPS" --log_interval 50
        --log_dir "$OUT" --overwrite "${@:2}")
FAILED=()
run() {  # run NAME SCRIPT [MODE] FLAGS...: python SCRIPT [MODE] FLAGS COMMON --run_name NAME
        local name=$1; shift; wanted "$name" || return 0
        local shown="$*"  # the compile cache as CACHE
        echo "== $name: python ${shown//"$CACHE"/CACHE} ${COMMON[*]}"
        row "$name" python "$@" "${COMMON[@]}" --run_name "$name"; }
row() {  # row NAME COMMAND...: COMMAND as a job; a row that failed is named, the table written again
    local name=$1 code
    shift
    job_run "$ROW_TIMEOUT" "$@"
    code=$?
    [ "$code" -eq 0 ] || FAILED+=("$name")
    [ "$code" -ne 124 ] || echo "$name: stopped after ROW_TIMEOUT=$ROW_TIMEOUT s"
    write_table; }
write_table() {  # the table written whole or not at all: a row stopped meanwhile leaves the last one
    local written="${SUMMARY%/*}/.${SUMMARY##*/}.tmp"  # beside SUMMARY: the move is one rename
    table > "$written" && mv "$written" "$SUMMARY"
    WRITTEN=1; }
WRITTEN=0
table() {  # the table of every run under OUT, and the rows that failed
    python - "$OUT" "${FAILED[@]}" <<'PY'
import json, os, sys
from pathlib import Path
out, failed = Path(sys.argv[1]), sys.argv[2:]
order = ["fast", "unaligned", "align16", "align32", "cudnn_limit0", "plain", "classic", "data_parallel",
         "dist_parallel", "width8", "compiled_cold", "compiled_warm", "compiled"]
found = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/results.json")}
runs = {name: found[name] for name in sorted(found, key=lambda n: order.index(n) if n in order else 99)}
fast = runs["fast"]["summary"]["images_per_sec"] if "fast" in runs else None
env = next(iter(runs.values()))["env"] if runs else None
# The bounds already computed, kept beside the runs: a bound takes torch's import and a step recorded
# op by op (seconds: the header), and the table is written again after every row
known = out / ".bounds.json"
bounds = json.loads(known.read_text()) if known.is_file() else {}
MODEL = ("model", "depth", "alpha", "block", "width_multiple", "align_channels", "dataset", "amp",
         "batch_size")


def bound_of(cfg):
    """The roofline of a run's own model (fast.py's, or the plain train.py's) at its precision and the
    lines that describe it, None off the GPU table; computed once for each model, GPU, precision and
    batch."""
    gpu = env["gpus"][0] if env and env["gpus"] else ""
    key = json.dumps([gpu, "loader" in cfg, *(cfg.get(name) for name in MODEL)])
    if key not in bounds:
        bounds[key] = compute_bound(cfg, gpu)
        written = known.with_name(f".bounds.{os.getpid()}.tmp")  # written whole: one rename
        written.write_text(json.dumps(bounds))
        written.replace(known)
    return bounds[key]


def compute_bound(cfg, gpu):
    if not gpu or cfg.get("model", "pyramidnet") != "pyramidnet":  # no GPU, no peak: no import
        return None
    sys.path.insert(0, ".")
    from benchmarks.roofline import bound_lines, bound_of_run  # the runs' model, from their config
    bound = bound_of_run(cfg, gpu)
    if bound is None:
        return None
    return {**{key: value for key, value in bound.items() if key != "categories"},
            "lines": bound_lines(bound)}


if env:
    print(f"{', '.join(env['gpus']) or 'no GPU'}; torch {env['torch']}, CUDA {env['cuda']}")
    first = bound_of(runs["fast"]["config"]) if "fast" in runs else None
    if first:  # benchmarks/roofline.py's four bounds, labelled as it labels them
        print(f"bounds of the fast row's model at batch {runs['fast']['config']['batch_size']} "
              f"({first['peak_tflops']:g} TFLOP/s, {first['bandwidth_tbs']:g} TB/s, "
              f"{first['kernel_us']:g} us a kernel; benchmarks/roofline.py); the table gives each "
              f"row's images/s as a % of two of its own model's bounds at its own precision:")
        print("\n".join(f"  {line}" for line in first["lines"]))
print("| run | images/s | x fast | batch p50 ms | p90 ms | data wait % | peak GB alloc (reserved) | MFU % "
      "| % of op-by-op bound | % of training-fused bound | first step s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name, r in runs.items():
    s = r["summary"]
    ratio = f"{s['images_per_sec'] / fast:.3f}" if fast else "-"
    mfu = f"{100 * s['mfu']:.1f}" if s["mfu"] is not None else "-"
    bound = bound_of(r["config"])
    shares = [f"{100 * s['images_per_sec'] / bound[f'{key}_images_per_sec']:.1f}" if bound else "-"
              for key in ("op_by_op", "training_fused")]
    first_s = f"{s['first_step_s']:.1f}" if s.get("first_step_s") is not None else "-"
    peak = "-" if s["peak_mem_gb"] is None else f"{s['peak_mem_gb']:.2f}"
    peak += f" ({s['peak_mem_reserved_gb']:.2f})" if s.get("peak_mem_reserved_gb") is not None else ""
    print(f"| {name} | {s['images_per_sec']:.0f} | {ratio} | {1e3 * s['batch_time_p50']:.1f} "
          f"| {1e3 * s['batch_time_p90']:.1f} | {100 * s['data_wait_frac']:.2f} | {peak} | {mfu} "
          f"| {' | '.join(shares)} | {first_s} |")
for other in ("plain", "classic"):
    if fast and other in runs:
        print(f"fast / {other}: {fast / runs[other]['summary']['images_per_sec']:.2f}x")
if failed:
    print(f"failed: {', '.join(failed)} (their output is above)")
PY
}

# The compile cache of the compiled rows (the first compiled run is cold, the second warm): COMPILE_CACHE,
# kept, or an empty folder made only for them and removed when the script ends, however it ends
if compiled_rows && [ -n "${COMPILE_CACHE:-}" ]; then
    CACHE=$COMPILE_CACHE
    mkdir -p "$CACHE" || exit 1
    echo "CACHE: $CACHE (COMPILE_CACHE), the compiled rows' torch.compile cache, kept at the end"
elif compiled_rows; then
    TEMPORARY=$(mktemp -d) || exit 1
    CACHE=$TEMPORARY
    echo "CACHE: a temporary folder for the compiled rows' torch.compile cache, removed at the end"
fi
FAST=benchmarks/fast.py
run fast            $FAST single_gpu
run unaligned       $FAST single_gpu --align_channels 0
run align16         $FAST single_gpu --align_channels 16
run align32         $FAST single_gpu --align_channels 32
run cudnn_limit0    $FAST single_gpu --cudnn_benchmark_limit 0
run plain           single_gpu/train.py
run classic         single_gpu/train.py --amp off --no-channels_last
run data_parallel   $FAST data_parallel
run dist_parallel   $FAST dist_parallel --nproc_per_node 1
run width8          $FAST single_gpu --width_multiple 8
if [ "${COMPILE:-1}" != 0 ]; then
    run compiled_cold $FAST single_gpu --compile --compile_mode reduce-overhead --compile_cache "$CACHE"
    run compiled_warm $FAST single_gpu --compile --compile_mode reduce-overhead --compile_cache "$CACHE"
fi
if [ "${COMPILE:-1}" = all ]; then
    run compiled      $FAST single_gpu --compile --compile_cache "$CACHE"
fi
if wanted profile; then
    row profile python benchmarks/profile_step.py --batch_size 256 "${@:2}" --out "$OUT/profile.json"
    row profile_width8 python benchmarks/profile_step.py --batch_size 256 "${@:2}" \
        --width_multiple 8 --out "$OUT/profile_width8.json"
fi
[ "$WRITTEN" = 1 ] || write_table  # no row ran: the table of the runs OUT holds already
cat "$SUMMARY"
[ ${#FAILED[@]} -eq 0 ]
