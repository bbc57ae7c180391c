#!/usr/bin/env bash
# Run 43 (issue 19): the code after review: the Rust suite, threads pass by pass, the traces, the C ABI's cost paired.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
echo "== tests" | tee -a "$S"
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
for n in 8 16; do timeout 60 bin/pool_threads $n 10000 4 contended >> "$O/pool_threads.txt" 2>&1; done
for t in traces/*.csv; do
  timeout 150 bin/gpumem --device cuda replay "$t" --alloc pool --repeats 3 --warm-passes 5 --json >> "$O/replay.jsonl" 2>> "$O/replay.err"
done
for c in pool caching; do
  timeout 90 taskset -c 3 bin/gpumem --device cuda capi-cost --conf resource=$c --pairs 20000 --runs 301 --json >> "$O/capi-cost.jsonl" 2>>"$O/capi.err"
done
cat "$O/pool_threads.txt" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/replay.jsonl"):
    r = json.loads(l)
    print(f"replay {r['params'][:28]} {r['alloc']}: ns/op {r['ns_per_op']:.1f} res/live {r['reserved_over_live']:.3f}")
for l in open(f"{o}/capi-cost.jsonl"):
    r = json.loads(l)
    print(f"capi-cost {r['conf'][:14]:14} {r['path']:8} ns/call {r['ns_per_call']:6.1f} paired {r['overhead_paired_ns_per_call'] or 0:+5.1f}")
PY
cat "$S"
