#!/usr/bin/env bash
# Run 59 (issue 19): PoolResource with expandable heaps: the Rust suite, gpumem bench
# (iterations, traces, threads) beside pool, vpool and cuda-async, C ABI per-call cost.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -8 >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
echo "== bench ($(( $(date +%s) - t0 ))s)" >> "$S"
A=cuda-async,pool,pool-expandable,vpool
for v in 0 0.3 1.0; do
  timeout 150 bin/gpumem --device cuda bench --workload iterations --vary $v --passes 6 --repeats 3 \
     --alloc $A --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
done
for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
  timeout 150 bin/gpumem --device cuda bench --workload replay --trace $t --passes 6 --repeats 3 \
     --alloc $A --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
done
for n in 8 16; do
  timeout 60 bin/gpumem --device cuda bench --workload threads --threads $n --warm --repeats 5 \
     --alloc pool,pool-expandable --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
done
echo "== capi ($(( $(date +%s) - t0 ))s)" >> "$S"
for r in 1 2 3; do
  for c in resource=pool resource=pool,expandable=false; do
    timeout 60 taskset -c 3 bin/gpumem --device cuda capi-cost --conf $c --pairs 200000 --runs 11 --json >> "$O/capi.jsonl" 2>> "$O/capi.err"
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    f = lambda k: f"{r[k]:.0f}" if isinstance(r.get(k), (int, float)) else "-"
    rl = r.get("reserved_over_live")
    w = r.get('workload')
    tag = f"vary={r.get('vary')}" if w == 'iterations' else (str(r.get('trace') or '').split('/')[-1][:10] if w == 'replay' else f"t={r.get('threads')}")
    print(f"{w[:5]} {tag:12} {r['alloc']:15} ns/op {f('ns_per_op'):>6} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} res/live {rl if rl is None else round(rl, 3)}")
for l in open(f"{o}/capi.jsonl"):
    r = json.loads(l)
    print(f"capi {r.get('conf','')[:40]:40} {r.get('path','')}: " + " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items() if 'ns' in k))
PY
tail -3 "$O/bench.err" >> "$S"
cat "$S"
