#!/usr/bin/env bash
# Run 50 (issue 19): statistics counted per lock shard: the Rust suite; the C ABI with threads at once, base and new.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
timeout 230 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -5 >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
echo "== capi threads ($(( $(date +%s) - t0 ))s)" >> "$S"
tag() { python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$1'; print(json.dumps(r))"; }
for n in 1 8 16; do
  timeout 60 bin/gpumem --device cuda capi-cost --conf resource=pool --threads $n --pairs 20000 --runs 31 --json 2>> "$O/capi.err" | tag gpumem >> "$O/capi-threads.jsonl"
done
timeout 60 bin/gpumem --device cuda capi-cost --conf resource=pool,spread=always --threads 8 --pairs 20000 --runs 31 --json 2>> "$O/capi.err" | tag gpumem >> "$O/capi-threads.jsonl"
for round in 1 2 3; do
  for b in gpumem-base gpumem; do
    timeout 60 taskset -c 3 bin/$b --device cuda capi-cost --conf resource=pool --pairs 20000 --runs 101 --json 2>> "$O/capi.err" | tag $b >> "$O/capi-one.jsonl"
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/capi-threads.jsonl"):
    r = json.loads(l)
    print(f"{r['conf'][:28]:28} threads {r['threads']:2} {r['path']:8}: ns/call {r['ns_per_call']:7.1f} ({r['ns_per_call_min']:.1f}..{r['ns_per_call_max']:.1f})")
for l in open(f"{o}/capi-one.jsonl"):
    r = json.loads(l)
    print(f"one thread {r['build']:11} {r['path']:8}: ns/call {r['ns_per_call']:6.1f} paired {r['overhead_paired_ns_per_call'] or 0:+5.1f}")
PY
head -3 "$O/capi.err" >> "$S"
cat "$S"
