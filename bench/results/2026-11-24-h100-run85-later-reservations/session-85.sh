#!/usr/bin/env bash
# Run 85 (issue 19): VirtualPool's later reservations sized above the first
# (5ddb555, bin/gpumem) against d85534a (bin/gpumem-base). The Rust suite;
# both traces and iterations (vary 0, 0.3, 1) through vpool and
# vpool-sharded, 6 passes, two rounds with the builds in turn; threads (8
# and 16, 12 passes), two rounds.
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
echo "== bench ($(( $(date +%s) - t0 ))s)" >> "$S"
for round in 1 2; do
  for b in gpumem-base gpumem; do
    for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
      timeout 100 bin/$b --device cuda bench --workload replay --trace $t --passes 6 --repeats 3 \
         --alloc vpool,vpool-sharded --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/bench.jsonl"
    done
    for v in 0 0.3 1.0; do
      timeout 100 bin/$b --device cuda bench --workload iterations --vary $v --passes 6 --repeats 3 \
         --alloc vpool --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/bench.jsonl"
    done
    for n in 8 16; do
      timeout 120 bin/$b --device cuda bench --workload threads --threads $n --ops 200000 --warm --passes 12 --repeats 3 \
        --alloc vpool --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,\"threads\":$n,/" >> "$O/bench.jsonl"
    done
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    f = lambda k: f"{r[k]:.0f}" if isinstance(r.get(k), (int, float)) else "-"
    rl = r.get("reserved_over_live")
    w = r['workload']
    tag = f"vary={r.get('vary')}" if w == 'iterations' else (f"t{r.get('threads')}" if w == 'threads' else r.get('params', '').split()[0][6:16])
    print(f"r{r['round']} {r['build']:11} {tag:11} {r['alloc']:13} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} maps {r.get('vmm_mappings')} res/live {rl if rl is None else round(rl, 3)} {r.get('error') or ''}")
PY
tail -n 3 "$O/bench.err" >> "$S"
cat "$S"
