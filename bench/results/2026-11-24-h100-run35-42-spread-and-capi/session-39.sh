#!/usr/bin/env bash
# Run 39 (issue 19): final code: tests; the C ABI's cost, paired; threads; both traces.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
echo "== tests" | tee -a "$S"
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
echo "== capi-cost paired ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
for b in gpumem-base gpumem; do
  for c in pool vpool caching arena; do
    timeout 90 taskset -c 3 bin/$b --device cuda capi-cost --conf resource=$c --pairs 20000 --runs 301 --json 2>>"$O/capi.err" \
      | python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$b'; print(json.dumps(r))" >> "$O/capi-cost.jsonl"
  done
done
echo "== threads ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
for n in 8 16; do
  for ops in 10000 200000; do
    timeout 120 bin/gpumem --device cuda bench --workload threads --threads $n --ops $ops --warm --repeats 3 --alloc pool,pool-sharded,vpool --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
  done
done
echo "== traces ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
for t in traces/*.csv; do
  timeout 150 bin/gpumem --device cuda replay "$t" --alloc pool,vpool --repeats 3 --warm-passes 5 --json >> "$O/replay.jsonl" 2>> "$O/replay.err"
done
echo "== done in $(( $(date +%s) - t0 ))s" | tee -a "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/capi-cost.jsonl"):
    r = json.loads(l)
    print(f"capi-cost {r['conf'][:14]:14} {r['build']:11} {r['path']:8} ns/call {r['ns_per_call']:6.1f} over {r['overhead_ns_per_call'] or 0:+5.1f} paired {r['overhead_paired_ns_per_call'] or 0:+5.1f}" if 'overhead_paired_ns_per_call' in r else f"capi-cost {r['conf'][:14]:14} {r['build']:11} {r['path']:8} ns/call {r['ns_per_call']:6.1f} over {r['overhead_ns_per_call'] or 0:+5.1f}")
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    print(f"{r['workload']} {r['params'][:26]} {r['alloc']:12}: ns/op {r['ns_per_op']:.0f} min {r['ns_per_op_min']:.0f} res/live {r['reserved_over_live']:.3f}")
for l in open(f"{o}/replay.jsonl"):
    r = json.loads(l)
    keys = {k: r.get(k) for k in ("first_ns_per_op", "second_ns_per_op", "steady_ns_per_op", "ns_per_op", "reserved_over_live")}
    print(f"replay {r.get('params', r.get('trace', ''))[:30]} {r['alloc']}: {keys}")
PY
cat "$S"
