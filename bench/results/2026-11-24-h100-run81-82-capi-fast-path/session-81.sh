#!/usr/bin/env bash
# Run 81 (issue 19): the C ABI's per-call cost after 397a736 and 7ba1588 (one
# off-limits flag, the allocation result tested once, a shorter device and
# stream lookup), paired against d7eafde (bin/gpumem-base), alternating,
# 16 rounds on one CPU; the Rust suite.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -8 >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
echo "== capi ($(( $(date +%s) - t0 ))s)" >> "$S"
for r in $(seq 1 16); do
  for b in gpumem-base gpumem; do
    timeout 60 taskset -c 5 bin/$b --device cuda capi-cost --conf resource=pool --pairs 50000 --runs 31 --json \
      | sed "s/^{/{\"build\":\"$b\",\"round\":$r,/" >> "$O/capi.jsonl" 2>> "$O/capi.err"
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
rows = [json.loads(l) for l in open(f"{o}/capi.jsonl")]
res = {(r['round'], r['build']): r['ns_per_call'] for r in rows if r['path'] == 'resource'}
for b in ('gpumem-base', 'gpumem'):
    v = [(r['round'], r['overhead_paired_ns_per_call'], res[(r['round'], b)]) for r in rows if r['build'] == b and r['path'] == 'capi']
    print(f"{b:11} rounds (round, paired overhead, rust ns): {[(a, round(x,1), round(y,1)) for a,x,y in v]}")
    allv = [x for _,x,_ in v]
    fast = [x for _,x,y in v if y < 40]
    print(f"MEDIAN {b:11} paired capi overhead all {st.median(allv):.2f} ({len(allv)})" + (f", fast-state rounds (rust < 40 ns) {st.median(fast):.2f} ({len(fast)})" if fast else ""))
for b in ('gpumem-base', 'gpumem'):
    v = [r['overhead_paired_ns_per_call'] for r in rows if r['build'] == b and r['path'] == 'stack']
    print(f"MEDIAN {b:11} paired stack overhead all {st.median(v):.2f} ({len(v)})")
ratio = []
for r in sorted({r['round'] for r in rows}):
    c = {x['build']: x['ns_per_call'] for x in rows if x['round'] == r and x['path'] == 'capi'}
    if len(c) == 2: ratio.append(c['gpumem'] / c['gpumem-base'])
print(f"capi ns new/base paired by round: median {st.median(ratio):.3f} over {len(ratio)}")
PY
tail -3 "$O/capi.err" >> "$S"
cat "$S"
