#!/usr/bin/env bash
# Run 54 (issue 19): VirtualPool lends its shards' locks to the statistics: the Rust suite; the C ABI with threads; PyTorch on vpool.
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
for c in vpool pool; do
  for n in 1 8 16; do
    timeout 60 bin/gpumem --device cuda capi-cost --conf resource=$c --threads $n --pairs 20000 --runs 31 --json >> "$O/capi-threads.jsonl" 2>> "$O/capi.err"
  done
done
for round in 1 2 3; do
  for b in gpumem-base gpumem; do
    timeout 60 taskset -c 3 bin/$b --device cuda capi-cost --conf resource=vpool --pairs 20000 --runs 101 --json 2>> "$O/capi.err" \
      | python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$b'; print(json.dumps(r))" >> "$O/capi-one.jsonl"
  done
done
echo "== torch ($(( $(date +%s) - t0 ))s)" >> "$S"
timeout 250 python3 python/bench/torch_allocators.py speed --configs native:vpool --out "$O/torch_speed.jsonl" > "$O/torch.log" 2>&1
echo "torch rc=$? done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/capi-threads.jsonl"):
    r = json.loads(l)
    print(f"{r['conf'][:15]:15} threads {r['threads']:2} {r['path']:8}: ns/call {r['ns_per_call']:7.1f}")
for l in open(f"{o}/capi-one.jsonl"):
    r = json.loads(l)
    print(f"vpool one thread {r['build']:11} {r['path']:8}: ns/call {r['ns_per_call']:6.1f} paired {r['overhead_paired_ns_per_call'] or 0:+5.1f}")
for l in open(f"{o}/torch_speed.jsonl"):
    r = json.loads(l)
    print(f"torch {r['model']} {r['config']}: s/iter {r['s_per_iter']:.5f} peak_reserved {r['peak_reserved']/1e9:.3f} GB")
PY
head -3 "$O/capi.err" >> "$S"
cat "$S"
