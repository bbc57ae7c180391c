#!/usr/bin/env bash
# A real PyTorch job's memory, recorded on the GPU machine and turned into
# `gpumem view` pages: GPT-2 small training with changing sequence lengths
# (real_jobs.py's `lm`), under PyTorch's allocator (its memory snapshot,
# with stacks) and under gpumem's default, `vpool` and `caching` (each
# with its `log=` recording and its snapshot). Run from inside gpu-bundle
# (the full one: it needs bin/gpumem); writes under OUT_DIR the
# recordings and snapshots (gzipped: a page that fails can be made again
# from them) and one page per recording, and prints what it wrote. The
# pages then open here, in the browser test
# (crates/gpumem-cli/tests/browser/view_page.mjs).
#
# Usage: gpu-bundle/view-real-job.sh [OUT_DIR] [STEPS]   (default: out/view, 6)
set -uo pipefail
cd "$(dirname "$0")"
mkdir -p "${1:-out/view}"
out=$(cd "${1:-out/view}" && pwd)
steps=${2:-6}
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/torch_extensions}
job() { # NAME CONFIG
  timeout 300 python3 python/bench/real_jobs.py child --job lm --config "$2" --steps "$steps" \
    --snapshot "$out/$1.pickle" > "$out/$1.log" 2>&1
  echo "$1 ($2): rc=$? $(grep -o '"peak_reserved": [0-9]*' "$out/$1.log")"
}
job torch torch
for r in pool vpool caching; do
  job "$r" "native:$r+log=$out/$r.rmm.csv"
done
for f in "$out"/*.pickle "$out"/*.rmm.csv; do
  [[ -f $f ]] || continue
  page=${f%.*}.html
  /usr/bin/time -f "%e s" bin/gpumem --device sim view "$f" -o "$page" > "$page.txt" 2>&1
  rc=$?
  echo "view $(basename "$f"): rc=$rc $(tail -1 "$page.txt"); $(grep -m1 '^wrote' "$page.txt")"
  (( rc == 0 )) || head -3 "$page.txt"
done
# The recordings travel too (gzipped): a page that fails can be made again
# from them here.
gzip -f "$out"/*.rmm.csv "$out"/*.pickle
