#!/usr/bin/env bash
# Run 86, second call: pool-expandable on both traces, 6 rounds with the
# builds in turn (bin/gpumem-base = 37ba6d9, bin/gpumem = 3c61a2f), each
# pinned to one CPU, to tell the builds' steady states apart from the
# host's drift.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
for round in 1 2 3 4 5 6; do
  for b in gpumem-base gpumem; do
    for t in traces/resnet50_train.rmm.csv traces/gpt2_train.rmm.csv; do
      timeout 100 taskset -c 5 bin/$b --device cuda bench --workload replay --trace $t --passes 8 --repeats 3 \
         --alloc pool-expandable --json 2>> "$O/bench2.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/bench2.jsonl"
    done
  done
done
python3 - "$O" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
rows = [json.loads(l) for l in open(f"{o}/bench2.jsonl")]
for r in rows:
    print(f"r{r['round']} {r['build']:11} {r['params'].split()[0][6:16]:11} first {r['first_ns_per_op']:.0f} second {r['second_ns_per_op']:.0f} steady {r['steady_ns_per_op']:.0f} res/live {r['reserved_over_live']:.4f}")
for t in ("resnet50_t", "gpt2_train"):
    for b in ("gpumem-base", "gpumem"):
        sel = [r for r in rows if r['build'] == b and r['params'].split()[0][6:16] == t]
        print(f"median {t} {b:11} first {st.median(r['first_ns_per_op'] for r in sel):.0f} second {st.median(r['second_ns_per_op'] for r in sel):.0f} steady {st.median(r['steady_ns_per_op'] for r in sel):.0f} (n={len(sel)})")
PY
