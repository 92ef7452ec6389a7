#!/usr/bin/env bash
# The fast-path benchmark on one GPU: PyramidNet-110 alpha=270, global batch 256, every run in one go so the
# ratios compare runs on the same GPU. Results: OUT/<run>/results.json, OUT/profile*.json, OUT/summary.txt.
#   bash benchmarks/fast_path.sh [OUT [train.py flags for every run...]]     (default OUT: runs/fast_path)
#   BENCHMARK_STEPS=100 COMPILE=0 bash benchmarks/fast_path.sh ...    fewer timed steps; no --compile run (its
#                                                                      compilation takes minutes)
# A run that fails is named in the summary and the others still run; the exit status is then 1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${1:-runs/fast_path}
VISIBLE=${CUDA_VISIBLE_DEVICES:-0}
export CUDA_VISIBLE_DEVICES=${VISIBLE%%,*}  # one GPU: the first visible one, for every run
STEPS=${BENCHMARK_STEPS:-200}
COMMON=(--benchmark --batch_size 256 --warmup_steps 30 --benchmark_steps "$STEPS" --log_interval 50
        --no_progress --log_dir "$OUT" --overwrite "${@:2}")
FAILED=()
run() { local name=$1 script=$2; shift 2; echo "== $name: python $script ${COMMON[*]} $*"
        python "$script" "${COMMON[@]}" --run_name "$name" "$@" || FAILED+=("$name"); }

run fast            single_gpu/train.py
run classic         single_gpu/train.py --loader torchvision --amp off --no_channels_last
run data_parallel   data_parallel/train.py
run dist_parallel   dist_parallel/train.py --nproc_per_node 1
run width8          single_gpu/train.py --width_multiple 8
if [ "${COMPILE:-1}" = 1 ]; then run fast_compiled single_gpu/train.py --compile; fi
python benchmarks/profile_step.py --batch_size 256 "${@:2}" --out "$OUT/profile.json" || FAILED+=(profile)
python benchmarks/profile_step.py --batch_size 256 "${@:2}" --width_multiple 8 --out "$OUT/profile_width8.json" \
    || FAILED+=(profile_width8)

python - "$OUT" "${FAILED[@]}" <<'PY' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out, failed = Path(sys.argv[1]), sys.argv[2:]
runs = {p.parent.name: json.loads(p.read_text()) for p in sorted(out.glob("*/results.json"))}
fast = runs["fast"]["summary"]["images_per_sec"] if "fast" in runs else None
env = next(iter(runs.values()))["env"] if runs else None
if env:
    print(f"{', '.join(env['gpus'])}; torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}")
print("| run | images/s | x fast | batch p50 ms | p90 ms | data wait % | peak GB | MFU % | compile s |")
print("|---|---|---|---|---|---|---|---|---|")
for name, r in runs.items():
    s = r["summary"]
    ratio = f"{s['images_per_sec'] / fast:.3f}" if fast else "-"
    mfu = f"{100 * s['mfu']:.1f}" if s["mfu"] is not None else "-"
    compile_s = f"{s['compile_time_s']:.0f}" if s["compile_time_s"] is not None else "-"
    peak = f"{s['peak_mem_gb']:.2f}" if s["peak_mem_gb"] is not None else "-"
    print(f"| {name} | {s['images_per_sec']:.0f} | {ratio} | {1e3 * s['batch_time_p50']:.1f} "
          f"| {1e3 * s['batch_time_p90']:.1f} | {100 * s['data_wait_frac']:.2f} | {peak} | {mfu} | {compile_s} |")
if failed:
    print(f"failed: {', '.join(failed)} (their output is above)")
PY
[ ${#FAILED[@]} -eq 0 ]
