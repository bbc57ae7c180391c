#!/usr/bin/env bash
# Run 45 (issue 19): VirtualPool's steady state, base and new builds alternating, one process per cell.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
tag() { python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$1'; r['round']=$2; print(json.dumps(r))"; }
for round in 1 2 3 4 5 6 7 8; do
  for b in gpumem-base gpumem; do
    for t in traces/*.csv; do
      timeout 60 taskset -c 3 bin/$b --device cuda replay "$t" --alloc vpool,pool --repeats 3 --warm-passes 5 --json 2>> "$O/replay.err" | tag $b $round >> "$O/replay.jsonl"
    done
  done
done
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
rows = [json.loads(l) for l in open(f"{o}/replay.jsonl")]
for t in ["gpt2", "resnet50"]:
    for a in ["vpool", "pool"]:
        for b in ["gpumem-base", "gpumem"]:
            sel = [r for r in rows if r["alloc"] == a and r["build"] == b and t in r["params"]]
            v = [round(r["ns_per_op"], 1) for r in sel]
            print(f"{t:8} {a:5} {b:11}: median {st.median(v):6.1f} rounds {v}")
PY
cat "$S"
