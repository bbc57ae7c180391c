#!/usr/bin/env bash
# Run 86 (issue 19): the expandable large heap spares its range's free end
# (3c61a2f, bin/gpumem) against 37ba6d9 (bin/gpumem-base). The Rust suite;
# both traces and iterations (vary 0, 0.3, 1) through pool-expandable (the
# C ABI's default) and pool-recycling, 6 passes, three rounds with the
# builds in turn; threads (8 and 16, 12 passes), two rounds; PyTorch
# training with the default (native:pool) on the new library.
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
for round in 1 2 3; do
  for b in gpumem-base gpumem; do
    for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
      timeout 100 bin/$b --device cuda bench --workload replay --trace $t --passes 6 --repeats 3 \
         --alloc pool-expandable,pool-recycling --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/bench.jsonl"
    done
    for v in 0 0.3 1.0; do
      timeout 100 bin/$b --device cuda bench --workload iterations --vary $v --passes 6 --repeats 3 \
         --alloc pool-expandable,pool-recycling --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/bench.jsonl"
    done
  done
done
for round in 1 2; do
  for b in gpumem-base gpumem; do
    for n in 8 16; do
      timeout 120 bin/$b --device cuda bench --workload threads --threads $n --ops 200000 --warm --passes 12 --repeats 3 \
        --alloc pool-expandable --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,\"threads\":$n,/" >> "$O/bench.jsonl"
    done
  done
done
echo "== torch ($(( $(date +%s) - t0 ))s)" >> "$S"
GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python timeout 300 python3 python/bench/torch_allocators.py speed \
  --configs native:pool --out "$O/torch_speed.jsonl" > "$O/torch.log" 2>&1; echo "torch rc=$?" >> "$S"
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
    print(f"r{r['round']} {r['build']:11} {tag:11} {r['alloc']:15} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} res/live {rl if rl is None else round(rl, 4)} {r.get('error') or ''}")
try:
    for l in open(f"{o}/torch_speed.jsonl"):
        r = json.loads(l)
        print(f"torch {r['config']} {r['model']} s/iter {r.get('s_per_iter')} peak_reserved {r.get('peak_reserved')} max_allocated {r.get('max_allocated')} rc {r.get('rc')}")
except OSError as e:
    print("torch: no results", e)
PY
tail -n 3 "$O/bench.err" >> "$S"
tail -n 3 "$O/torch.log" >> "$S"
cat "$S"
