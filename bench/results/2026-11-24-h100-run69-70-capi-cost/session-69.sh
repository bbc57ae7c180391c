#!/usr/bin/env bash
# Run 69 (issue 19): the C ABI's per-call cost after a599540 (statistics keep no
# total added; the pool's serve/free inlined into both entry points), paired
# against the build before it (76733d8, bin/gpumem-base), alternating; the Rust
# suite on the final code; one steady-state replay per build as a check.
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
for r in 1 2 3 4 5; do
  for b in gpumem-base gpumem; do
    for c in resource=pool resource=pool,expandable=false; do
      timeout 60 taskset -c 3 bin/$b --device cuda capi-cost --conf $c --pairs 100000 --runs 21 --json \
        | sed "s/^{/{\"build\":\"$b\",\"round\":$r,/" >> "$O/capi.jsonl" 2>> "$O/capi.err"
    done
  done
done
echo "== replay ($(( $(date +%s) - t0 ))s)" >> "$S"
for r in 1 2; do
  for b in gpumem-base gpumem; do
    timeout 120 bin/$b --device cuda bench --workload replay --trace traces/gpt2_train.rmm.csv --passes 6 --repeats 3 \
       --alloc pool,pool-expandable --json | sed "s/^{/{\"build\":\"$b\",\"round\":$r,/" >> "$O/bench.jsonl" 2>> "$O/bench.err"
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
rows = [json.loads(l) for l in open(f"{o}/capi.jsonl")]
for l in rows:
    if l['path'] != 'resource':
        print(f"capi r{l['round']} {l['build']:11} {l['conf'][:32]:32} {l['path']:8} ns {l['ns_per_call']:.1f} over {l.get('overhead_ns_per_call') or 0:.1f} paired {l.get('overhead_paired_ns_per_call') or 0:.1f}")
    else:
        print(f"capi r{l['round']} {l['build']:11} {l['conf'][:32]:32} {l['path']:8} ns {l['ns_per_call']:.1f}")
for c in sorted({r['conf'] for r in rows}):
    for b in ('gpumem-base', 'gpumem'):
        v = [r['overhead_paired_ns_per_call'] for r in rows if r['conf'] == c and r['build'] == b and r['path'] == 'capi']
        if v: print(f"MEDIAN paired capi overhead {c[:32]:32} {b:11} {st.median(v):.2f} over {len(v)} rounds: {[round(x,1) for x in v]}")
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    f = lambda k: f"{r[k]:.0f}" if isinstance(r.get(k), (int, float)) else "-"
    print(f"replay r{r['round']} {r['build']:11} {r['alloc']:15} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} res/live {round(r.get('reserved_over_live') or 0, 3)}")
PY
tail -3 "$O/capi.err" "$O/bench.err" >> "$S"
cat "$S"
