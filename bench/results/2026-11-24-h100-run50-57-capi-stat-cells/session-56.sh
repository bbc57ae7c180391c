#!/usr/bin/env bash
# Run 56 (issue 19): the final code (fast-path inlining): the Rust suite; the C ABI's cost on one thread and with threads; the traces.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
timeout 230 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -5 >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
tag() { python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$1'; print(json.dumps(r))"; }
for c in pool vpool; do
  for n in 8 16; do
    timeout 60 bin/gpumem --device cuda capi-cost --conf resource=$c --threads $n --pairs 20000 --runs 31 --json 2>> "$O/capi.err" | tag gpumem >> "$O/capi-threads.jsonl"
  done
  for round in 1 2 3; do
    for b in gpumem-base gpumem; do
      timeout 60 taskset -c 3 bin/$b --device cuda capi-cost --conf resource=$c --pairs 20000 --runs 101 --json 2>> "$O/capi.err" | tag $b >> "$O/capi-one.jsonl"
    done
  done
done
for round in 1 2 3 4; do
  for b in gpumem-base gpumem; do
    for t in traces/*.csv; do
      timeout 60 taskset -c 3 bin/$b --device cuda replay "$t" --alloc vpool,pool --repeats 3 --warm-passes 5 --json 2>> "$O/replay.err" | tag $b >> "$O/replay.jsonl"
    done
  done
done
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
for l in open(f"{o}/capi-threads.jsonl"):
    r = json.loads(l)
    print(f"{r['conf'][:14]:14} threads {r['threads']:2} {r['path']:8}: ns/call {r['ns_per_call']:7.1f}")
rows = [json.loads(l) for l in open(f"{o}/capi-one.jsonl")]
for c in ["resource=pool", "resource=vpool"]:
    for b in ["gpumem-base", "gpumem"]:
        sel = [r for r in rows if r["build"] == b and r["conf"].startswith(c) and r["path"] == "capi"]
        res = [r for r in rows if r["build"] == b and r["conf"].startswith(c) and r["path"] == "resource"]
        print(f"one thread {c:15} {b:11}: resource {[round(r['ns_per_call'],1) for r in res]} capi paired {[round(r['overhead_paired_ns_per_call'],1) for r in sel]}")
rows = [json.loads(l) for l in open(f"{o}/replay.jsonl")]
for t in ["gpt2", "resnet50"]:
    for a in ["vpool", "pool"]:
        for b in ["gpumem-base", "gpumem"]:
            v = [round(r["ns_per_op"], 1) for r in rows if r["alloc"] == a and r["build"] == b and t in r["params"]]
            print(f"replay {t:8} {a:5} {b:11}: median {st.median(v):6.1f} {v}")
PY
head -3 "$O/capi.err" "$O/replay.err" >> "$S"
cat "$S"
