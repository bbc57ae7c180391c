#!/usr/bin/env bash
# Run 48 (issue 19): VirtualPool's threads pass by pass (when the shards come into use, what the move costs).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
for n in 8 16; do
  timeout 120 bin/gpumem --device cuda bench --workload threads --threads $n --passes 6 --repeats 1 --alloc vpool,vpool-sharded,pool --json 2>> "$O/bench.err" >> "$O/bench.jsonl"
  timeout 60 bin/gpumem-base --device cuda bench --workload threads --threads $n --passes 6 --repeats 1 --alloc vpool --json 2>> "$O/bench.err" \
    | python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['alloc']='vpool-base'; print(json.dumps(r))" >> "$O/bench.jsonl"
done
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    print(f"{r['params'][:20]} {r['alloc']:13}: passes {[round(x) for x in r['pass_ns_per_op']]} res/live {r['reserved_over_live']:.2f} maps {r['vmm_mappings']}")
PY
cat "$O/bench.err" | head -5 >> "$S"
cat "$S"
