#!/usr/bin/env bash
# Run 61 (issue 19): PyTorch training with the C ABI pool, expandable heaps (the default) against separate regions.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
timeout 560 python3 python/bench/torch_allocators.py speed --configs torch,native:pool,native:pool+expandable=false --out "$O/torch_speed.jsonl" > "$O/torch.log" 2>&1
echo "torch speed rc=$? in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/torch_speed.jsonl"):
    r = json.loads(l)
    print(f"torch {r['model']} {r['config']}: s/iter {r['s_per_iter']:.5f} peak_reserved {r['peak_reserved']/1e9:.3f} GB")
PY
tail -3 "$O/torch.log" >> "$S"
cat "$S"
