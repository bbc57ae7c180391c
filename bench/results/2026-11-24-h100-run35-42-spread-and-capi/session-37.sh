#!/usr/bin/env bash
# Run 37 (issue 19): PoolResource's shards used on contention; the C ABI's statistics under the pool's lock.
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
echo "== threads ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
for n in 8 16; do
  for b in gpumem-base gpumem; do
    timeout 120 bin/$b --device cuda bench --workload threads --threads $n --warm --repeats 5 --alloc pool,pool-sharded,vpool --json 2>> "$O/bench.err" \
      | python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$b'; print(json.dumps(r))" >> "$O/bench.jsonl"
  done
done
timeout 120 bin/gpumem --device cuda bench --workload iterations --vary 0.3 --passes 6 --repeats 3 --alloc pool --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
echo "== capi-cost ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
for round in 1 2 3; do
  for b in gpumem-base gpumem; do
    timeout 60 taskset -c 3 bin/$b --device cuda capi-cost --conf resource=pool --runs 11 --json 2>>"$O/capi.err" \
      | python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$b'; r['round']=$round; print(json.dumps(r))" >> "$O/capi-cost.jsonl"
  done
done
echo "== torch speed ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
timeout 300 python3 python/bench/torch_allocators.py speed --configs torch,native:pool,native:pool+shards=1 --out "$O/torch_speed.jsonl" > "$O/torch.log" 2>&1
echo "torch speed rc=$?" >> "$S"
echo "== done in $(( $(date +%s) - t0 ))s" | tee -a "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    print(f"{r['workload']} {r['params'][:22]} {r.get('build','gpumem'):11} {r['alloc']:12}: ns/op {r['ns_per_op']:.0f} steady {r.get('steady_ns_per_op') or 0:.0f} res/live {r['reserved_over_live']:.3f}")
rows = [json.loads(l) for l in open(f"{o}/capi-cost.jsonl")]
for b in ["gpumem-base", "gpumem"]:
    for p in ["resource", "stack", "capi"]:
        sel = [r for r in rows if r["build"] == b and r["path"] == p]
        if sel:
            print(f"capi-cost pool {b:12} {p:8} ns/call {st.median(r['ns_per_call'] for r in sel):6.1f} over {st.median(r['overhead_ns_per_call'] or 0 for r in sel):+5.1f} per round {[round(r['overhead_ns_per_call'] or 0, 1) for r in sel]}")
for l in open(f"{o}/torch_speed.jsonl"):
    r = json.loads(l)
    print(f"torch {r['model']} {r['config']}: s/iter {r['s_per_iter']:.5f} peak_reserved {r['peak_reserved']/1e9:.3f} GB")
PY
tail -3 "$O/torch.log" >> "$S"
cat "$S"
