#!/usr/bin/env bash
# The pictures in README.md and docs/comparing.md, from a real compare.py run on this machine: its PNGs are
# copied into docs/ and its report is left where it was written (printed at the end).
#   bash docs/pictures.sh                    # the default matrix, three runs of each configuration
#   bash docs/pictures.sh --gpu_counts 1 2   # any compare.py flags replace --repeat 3
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)/compare
args=("$@")
[ $# -gt 0 ] || args=(--repeat 3)
python compare.py --out "$out" "${args[@]}"
pictures=("$out"/*.png)
cp "${pictures[@]}" docs/
echo "docs/: ${pictures[*]##*/} from $out/report.md"
