#!/usr/bin/env bash
# Run 58 (issue 19): the Rust suite and the C ABI with threads on the final commit (after review).
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
for c in pool vpool; do
  timeout 60 bin/gpumem --device cuda capi-cost --conf resource=$c --threads 8 --pairs 20000 --runs 31 --json >> "$O/capi-threads.jsonl" 2>> "$O/capi.err"
done
python3 - "$O" >> "$S" <<'PY'
import json, sys
for l in open(sys.argv[1] + "/capi-threads.jsonl"):
    r = json.loads(l)
    print(f"{r['conf'][:14]:14} threads {r['threads']} {r['path']:8}: ns/call {r['ns_per_call']:6.1f}")
PY
cat "$S"
