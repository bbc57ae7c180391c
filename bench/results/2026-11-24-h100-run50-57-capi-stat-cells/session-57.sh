#!/usr/bin/env bash
# Run 57 (issue 19): gpt2_train on VirtualPool, the final code against the build before the session, 12 rounds alternating.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
tag() { python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$1'; r['round']=$2; print(json.dumps(r))"; }
for round in $(seq 1 12); do
  for b in gpumem-base gpumem; do
    timeout 60 taskset -c 3 bin/$b --device cuda replay traces/gpt2_train.rmm.csv --alloc vpool --repeats 3 --warm-passes 5 --json 2>> "$O/replay.err" | tag $b $round >> "$O/replay.jsonl"
  done
done
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1] + "/replay.jsonl")]
for b in ["gpumem-base", "gpumem"]:
    v = [round(r["ns_per_op"], 1) for r in rows if r["build"] == b]
    print(f"gpt2 vpool {b:11}: median {st.median(v):6.1f} {v}")
d = [a["ns_per_op"] - b["ns_per_op"] for a, b in zip([r for r in rows if r["build"] == "gpumem"], [r for r in rows if r["build"] == "gpumem-base"])]
print(f"paired difference new - base: median {st.median(d):+.1f} ns/op, {sum(x > 0 for x in d)} of {len(d)} rounds slower")
PY
cat "$S"
