#!/usr/bin/env bash
# Run 77 (issue 19): the threads workload with the same threads and streams
# in every pass (0530eaa, bin/gpumem) against new ones each pass (c5cd418,
# bin/gpumem-base), two rounds in turn: 8 and 16 threads, 200,000
# operations, one warm pass, 6 timed passes, 3 repeats.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
for round in 1 2; do
  for b in gpumem-base gpumem; do
    for n in 8 16; do
      timeout 120 bin/$b --device cuda bench --workload threads --threads $n --ops 200000 --warm --passes 6 --repeats 3 \
        --alloc pool,vpool,vpool-sharded,cuda-async --json 2>> "$O/bench.err" \
        | sed "s/^{/{\"build\":\"$b\",\"round\":$round,\"threads\":$n,/" >> "$O/threads.jsonl"
    done
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/threads.jsonl"):
    r = json.loads(l)
    p = " ".join(f"{x:.0f}" for x in r.get("pass_ns_per_op") or [])
    rl = r.get("reserved_over_live")
    print(f"r{r['round']} {r['build']:12} t{r['threads']:<3} {r['alloc']:14} passes [{p}] steady {r.get('steady_ns_per_op') or 0:.0f} maps {r.get('vmm_mappings')} res/live {rl if rl is None else round(rl, 2)} {r.get('error') or ''}")
PY
tail -3 "$O/bench.err" >> "$S"
cat "$S"
