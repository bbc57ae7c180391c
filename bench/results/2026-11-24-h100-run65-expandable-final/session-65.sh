#!/usr/bin/env bash
# Run 65 (issue 19): the final code (small-heap growth step): Rust suite, and gpumem bench
# iterations and traces for pool and pool-expandable (first, second, steady, reserved/live).
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
A=pool,pool-expandable
for v in 0 0.3 1.0; do
  timeout 100 bin/gpumem --device cuda bench --workload iterations --vary $v --passes 6 --repeats 3 \
     --alloc $A --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
done
for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
  timeout 100 bin/gpumem --device cuda bench --workload replay --trace $t --passes 6 --repeats 5 \
     --alloc $A --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    f = lambda k: f"{r[k]:.0f}" if isinstance(r.get(k), (int, float)) else "-"
    rl = r.get("reserved_over_live")
    tag = f"vary={r.get('vary')}" if r['workload'] == 'iterations' else r.get('params', '').split()[0][6:16]
    print(f"{tag:12} {r['alloc']:15} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} res/live {rl if rl is None else round(rl, 3)}")
PY
tail -3 "$O/bench.err" >> "$S"
cat "$S"
