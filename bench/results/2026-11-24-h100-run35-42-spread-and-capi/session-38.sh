#!/usr/bin/env bash
# Run 38 (issue 19): when PoolResource's threads spread over its shards, pass by pass; pytest on CUDA.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
echo "== pool_threads" | tee -a "$S"
for n in 8 16; do
  for s in contended always one; do
    timeout 60 bin/pool_threads $n 10000 6 $s >> "$O/pool_threads.txt" 2>&1
  done
done
echo "== threads bench ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
timeout 120 bin/gpumem --device cuda bench --workload threads --threads 8 --ops 200000 --warm --repeats 3 --alloc pool,pool-sharded --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
echo "== pytest cuda ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
timeout 450 python3 -m pytest -v -p no:cacheprovider python/tests > "$O/pytest.log" 2>&1; echo "pytest rc=$?" >> "$S"
tail -1 "$O/pytest.log" >> "$S"
grep -E "FAILED|ERROR" "$O/pytest.log" | head -5 >> "$S"
echo "== done in $(( $(date +%s) - t0 ))s" | tee -a "$S"
cat "$O/pool_threads.txt" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    print(f"{r['workload']} {r['params'][:24]} {r['alloc']:12}: ns/op {r['ns_per_op']:.0f} min {r['ns_per_op_min']:.0f} res/live {r['reserved_over_live']:.3f}")
PY
cat "$S"
