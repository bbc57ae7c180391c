#!/usr/bin/env bash
# Run 80 (issue 19): the threads workload for every allocator but `cuda`
# (0530eaa: the same threads and streams in every pass), 8 and 16 threads,
# 12 timed passes; then the C ABI's per-call cost, 8 rounds on one CPU.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
A=cuda-async,pool,pool-sharded,pool-expandable,arena,caching,binning,vpool,vpool-sharded
for n in 8 16; do
  timeout 240 bin/gpumem --device cuda bench --workload threads --threads $n --ops 200000 --warm --passes 12 --repeats 3 \
    --alloc $A --json 2>> "$O/bench.err" | sed "s/^{/{\"threads\":$n,/" >> "$O/threads.jsonl"
done
echo "== capi ($(( $(date +%s) - t0 ))s)" >> "$S"
for r in $(seq 1 8); do
  timeout 60 taskset -c 5 bin/gpumem --device cuda capi-cost --conf resource=pool --pairs 50000 --runs 31 --json \
    | sed "s/^{/{\"round\":$r,/" >> "$O/capi.jsonl" 2>> "$O/capi.err"
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
for l in open(f"{o}/threads.jsonl"):
    r = json.loads(l)
    p = " ".join(f"{x:.0f}" for x in r.get("pass_ns_per_op") or [])
    rl = r.get("reserved_over_live")
    print(f"t{r['threads']:<3} {r['alloc']:15} [{p}] steady {r.get('steady_ns_per_op') or 0:.0f} maps {r.get('vmm_mappings')} res/live {rl if rl is None else round(rl, 2)} {r.get('error') or ''}")
rows = [json.loads(l) for l in open(f"{o}/capi.jsonl")]
for path in ("resource", "stack", "capi"):
    v = [r for r in rows if r["path"] == path]
    print(path, "ns/call", [round(r["ns_per_call"], 1) for r in v], "paired overhead", [round(r["overhead_paired_ns_per_call"], 1) for r in v],
          "median overhead", round(st.median(r["overhead_paired_ns_per_call"] for r in v), 1))
PY
tail -3 "$O/bench.err" "$O/capi.err" >> "$S"
cat "$S"
