#!/usr/bin/env bash
# Run 74 (issue 19): expandable heaps that recycle free pieces (a72f9b4).
# The Rust suite; gpumem bench replay (both traces) and iterations (vary 0,
# 0.3, 1) for pool and pool-expandable, three builds in turn: the build
# before (1de11a6, bin/gpumem-base), this one (64 MiB pieces, bin/gpumem)
# and a variant with 128 MiB pieces (bin/gpumem-w128); PyTorch training
# through the C ABI (torch against native:pool).
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
echo "== bench ($(( $(date +%s) - t0 ))s)" >> "$S"
A=pool,pool-expandable
for round in 1 2; do
for b in gpumem-base gpumem gpumem-w128; do
  for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
    timeout 100 bin/$b --device cuda bench --workload replay --trace $t --passes 6 --repeats 5 \
       --alloc $A --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/bench.jsonl"
  done
  for v in 0 0.3 1.0; do
    timeout 100 bin/$b --device cuda bench --workload iterations --vary $v --passes 6 --repeats 3 \
       --alloc $A --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/bench.jsonl"
  done
done
done
echo "== torch ($(( $(date +%s) - t0 ))s)" >> "$S"
timeout 300 python3 python/bench/torch_allocators.py speed --configs torch,native:pool --out "$O/torch_speed.jsonl" > "$O/torch.log" 2>&1
echo "torch speed rc=$?" >> "$S"
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    f = lambda k: f"{r[k]:.0f}" if isinstance(r.get(k), (int, float)) else "-"
    rl = r.get("reserved_over_live")
    tag = f"vary={r.get('vary')}" if r['workload'] == 'iterations' else r.get('params', '').split()[0][6:16]
    print(f"r{r['round']} {r['build']:12} {tag:12} {r['alloc']:15} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} res/live {rl if rl is None else round(rl, 3)}")
try:
    for l in open(f"{o}/torch_speed.jsonl"):
        r = json.loads(l)
        print(f"torch {r['model']} {r['config']}: s/iter {r['s_per_iter']:.5f} peak_reserved {r['peak_reserved']/1e9:.3f} GB max_allocated {r['max_allocated']/1e9:.3f} GB")
except OSError as e:
    print("torch:", e)
PY
tail -3 "$O/bench.err" >> "$S"
tail -3 "$O/torch.log" >> "$S"
cat "$S"
