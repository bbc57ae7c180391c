#!/usr/bin/env bash
# Run 75 (issue 19): the final code of the recycling work (35c8e81: recycling
# opt-in, GPUMEM_CONF key recycle). The Rust suite; gpumem bench replay (both
# traces) and iterations (vary 0, 0.3, 1) for pool-expandable (the default
# pool) and pool-recycling, two rounds; PyTorch training through the C ABI:
# torch, native:pool, native:pool+recycle=true.
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
A=pool-expandable,pool-recycling
for round in 1 2; do
  for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
    timeout 100 bin/gpumem --device cuda bench --workload replay --trace $t --passes 6 --repeats 5 \
       --alloc $A --json 2>> "$O/bench.err" | sed "s/^{/{\"round\":$round,/" >> "$O/bench.jsonl"
  done
  for v in 0 0.3 1.0; do
    timeout 100 bin/gpumem --device cuda bench --workload iterations --vary $v --passes 6 --repeats 3 \
       --alloc $A --json 2>> "$O/bench.err" | sed "s/^{/{\"round\":$round,/" >> "$O/bench.jsonl"
  done
done
echo "== torch ($(( $(date +%s) - t0 ))s)" >> "$S"
timeout 400 python3 python/bench/torch_allocators.py speed \
  --configs torch,native:pool,native:pool+recycle=true,native:pool+recycle=true,native:pool,torch \
  --out "$O/torch_speed.jsonl" > "$O/torch.log" 2>&1
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
    print(f"r{r['round']} {tag:12} {r['alloc']:15} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} res/live {rl if rl is None else round(rl, 3)}")
try:
    for l in open(f"{o}/torch_speed.jsonl"):
        r = json.loads(l)
        if "error" in r:
            print(f"torch {r['model']} {r['config']}: ERROR {r['error'][-300:]}")
            continue
        print(f"torch {r['model']} {r['config']}: s/iter {r['s_per_iter']:.5f} peak_reserved {r['peak_reserved']/1e9:.3f} GB max_allocated {r['max_allocated']/1e9:.3f} GB")
except OSError as e:
    print("torch:", e)
PY
tail -3 "$O/bench.err" >> "$S"
tail -3 "$O/torch.log" >> "$S"
cat "$S"
