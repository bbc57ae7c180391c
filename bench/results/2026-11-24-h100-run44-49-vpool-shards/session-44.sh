#!/usr/bin/env bash
# Run 44 (issue 19): VirtualPool's lock shards used on contention: the Rust suite, threads, the traces (base and new).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
echo "== tests" | tee -a "$S"
timeout 230 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -5 >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
echo "== threads ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
tag() { python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$1'; print(json.dumps(r))"; }
for n in 8 16; do
  for ops in 10000 200000; do
    timeout 60 bin/gpumem-base --device cuda bench --workload threads --threads $n --ops $ops --warm --repeats 3 --alloc vpool --json 2>> "$O/bench.err" | tag gpumem-base >> "$O/bench.jsonl"
    timeout 60 bin/gpumem --device cuda bench --workload threads --threads $n --ops $ops --warm --repeats 3 --alloc pool,vpool,vpool-sharded --json 2>> "$O/bench.err" | tag gpumem >> "$O/bench.jsonl"
  done
done
echo "== traces ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
for round in 1 2; do
  for b in gpumem-base gpumem; do
    for t in traces/*.csv; do
      timeout 60 taskset -c 3 bin/$b --device cuda replay "$t" --alloc vpool,pool --repeats 3 --warm-passes 5 --json 2>> "$O/replay.err" | tag $b >> "$O/replay.jsonl"
    done
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" | tee -a "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    print(f"threads {r['params'][:30]} {r['build']:11} {r['alloc']:13}: ns/op {r['ns_per_op']:7.0f} res/live {r['reserved_over_live']:.3f}")
for l in open(f"{o}/replay.jsonl"):
    r = json.loads(l)
    print(f"replay {r['params'][:26]} {r['build']:11} {r['alloc']:6}: ns/op {r['ns_per_op']:6.1f} first {r.get('first_ns_per_op') or 0:7.1f} res/live {r['reserved_over_live']:.3f}")
PY
cat "$S"
