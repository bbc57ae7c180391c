#!/usr/bin/env bash
# Run 83 (issue 19): VirtualPool's least slack (slack_min_bytes, 64 MiB), the
# new build (bin/gpumem) against the last commit without it (c650839,
# bin/gpumem-base). The Rust suite; the threads workload (8 and 16 threads,
# 12 timed passes, 3 repeats), four rounds with the builds in turn; both
# traces and iterations (vary 0, 0.3, 1) through VirtualPool, one round each.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -8 >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
echo "== threads ($(( $(date +%s) - t0 ))s)" >> "$S"
for round in 1 2 3 4; do
  for b in gpumem-base gpumem; do
    for n in 8 16; do
      timeout 120 bin/$b --device cuda bench --workload threads --threads $n --ops 200000 --warm --passes 12 --repeats 3 \
        --alloc pool,vpool,vpool-sharded --json 2>> "$O/bench.err" \
        | sed "s/^{/{\"build\":\"$b\",\"round\":$round,\"threads\":$n,/" >> "$O/threads.jsonl"
    done
  done
done
echo "== replay and iterations ($(( $(date +%s) - t0 ))s)" >> "$S"
for b in gpumem-base gpumem; do
  for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
    timeout 100 bin/$b --device cuda bench --workload replay --trace $t --passes 6 --repeats 3 \
       --alloc vpool --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",/" >> "$O/bench.jsonl"
  done
  for v in 0 0.3 1.0; do
    timeout 100 bin/$b --device cuda bench --workload iterations --vary $v --passes 6 --repeats 3 \
       --alloc vpool --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",/" >> "$O/bench.jsonl"
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
steady = {}
for l in open(f"{o}/threads.jsonl"):
    r = json.loads(l)
    p = " ".join(f"{x:.0f}" for x in r.get("pass_ns_per_op") or [])
    rl = r.get("reserved_over_live")
    steady.setdefault((r['threads'], r['alloc'], r['build']), []).append(r.get('steady_ns_per_op') or 0)
    print(f"r{r['round']} {r['build']:12} t{r['threads']:<3} {r['alloc']:14} passes [{p}] steady {r.get('steady_ns_per_op') or 0:.0f} maps {r.get('vmm_mappings')} res/live {rl if rl is None else round(rl, 2)} {r.get('error') or ''}")
for k, v in sorted(steady.items()):
    print(f"steady t{k[0]} {k[1]:14} {k[2]:12} median {st.median(v):5.0f} rounds {' '.join(f'{x:.0f}' for x in v)}")
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    f = lambda k: f"{r[k]:.0f}" if isinstance(r.get(k), (int, float)) else "-"
    rl = r.get("reserved_over_live")
    tag = f"vary={r.get('vary')}" if r['workload'] == 'iterations' else r.get('params', '').split()[0][6:16]
    print(f"{r['build']:12} {tag:12} {r['alloc']:6} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} maps {r.get('vmm_mappings')} res/live {rl if rl is None else round(rl, 3)}")
PY
tail -3 "$O/bench.err" >> "$S"
cat "$S"
