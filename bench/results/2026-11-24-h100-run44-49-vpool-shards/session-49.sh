#!/usr/bin/env bash
# Run 49 (issue 19): the C ABI with threads at once (capi-cost --threads), PoolResource and VirtualPool.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
for c in pool vpool; do
  for n in 1 8 16; do
    timeout 120 bin/gpumem --device cuda capi-cost --conf resource=$c --threads $n --pairs 20000 --runs 31 --json >> "$O/capi-threads.jsonl" 2>> "$O/capi.err"
  done
done
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/capi-threads.jsonl"):
    r = json.loads(l)
    print(f"{r['conf'][:14]:14} threads {r['threads']:2} {r['path']:8}: ns/call {r['ns_per_call']:7.1f} ({r['ns_per_call_min']:.1f}..{r['ns_per_call_max']:.1f})")
PY
head -5 "$O/capi.err" >> "$S"
cat "$S"
