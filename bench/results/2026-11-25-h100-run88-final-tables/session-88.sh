#!/usr/bin/env bash
# Run 88 (issue 19): issue 19's tables on one build (REV): the Rust suite;
# threads (8 and 16), iterations (vary 0, 0.3, 1) and both traces (6
# passes: first, second, steady) for every allocator but `cuda`
# (cudaMalloc, about 50 us per operation); the C ABI's cost per call over
# the Rust pool on a created stream and on the legacy default stream; the
# default and vpool on both traces pinned to one CPU, 6 rounds; PyTorch's
# caching allocator on the same traces and iteration logs, driven from
# C++ (python/bench/torch_trace_replay.py).
# Usage, from the unpacked bundle: OUT=DIR ./session-88.sh [rust|torch|rust,torch]
# (GPUMEM_RUN_DEVICE=sim: a dry run without a GPU, no suite, no PyTorch.)
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
D=${GPUMEM_RUN_DEVICE:-cuda}   # sim: a dry run on a CPU machine
PIN="taskset -c 5"; (( $(nproc) > 5 )) || PIN=""   # one CPU, as runs 84 and 86
t0=$(date +%s)
{ git_rev=$(cat REV 2>/dev/null); echo "build $git_rev"; grep -m1 "model name" /proc/cpuinfo; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >> "$S"
P=${1:-rust,torch}   # parts: rust (suite, tables, C ABI, pinned traces), torch
if [[ ",$P," == *,rust,* ]]; then
[[ $D == cuda ]] && timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -8 >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
A=cuda-async,pool,pool-expandable,pool-sharded,pool-recycling,arena,caching,binning,vpool,vpool-sharded
echo "== threads ($(( $(date +%s) - t0 ))s)" >> "$S"
for n in 8 16; do
  timeout 240 bin/gpumem --device $D bench --workload threads --threads $n --ops 200000 --warm --passes 12 --repeats 3 \
    --alloc $A --json 2>> "$O/bench.err" | sed "s/^{/{\"threads\":$n,/" >> "$O/threads.jsonl"
done
echo "== iterations and traces ($(( $(date +%s) - t0 ))s)" >> "$S"
for v in 0 0.3 1.0; do
  timeout 150 bin/gpumem --device $D bench --workload iterations --vary $v --passes 6 --repeats 3 \
     --alloc $A --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
done
for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
  timeout 150 bin/gpumem --device $D bench --workload replay --trace $t --passes 6 --repeats 3 \
     --alloc $A --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
done
echo "== capi ($(( $(date +%s) - t0 ))s)" >> "$S"
for r in $(seq 1 8); do
  timeout 60 $PIN bin/gpumem --device $D capi-cost --conf resource=pool --pairs 50000 --runs 31 --json \
    | sed "s/^{/{\"stream\":\"created\",\"round\":$r,/" >> "$O/capi.jsonl" 2>> "$O/capi.err"
  timeout 60 $PIN bin/gpumem --device $D capi-cost --conf resource=pool --legacy-stream --pairs 50000 --runs 31 --json \
    | sed "s/^{/{\"stream\":\"legacy\",\"round\":$r,/" >> "$O/capi.jsonl" 2>> "$O/capi.err"
done
echo "== pinned traces ($(( $(date +%s) - t0 ))s)" >> "$S"
for round in 1 2 3 4 5 6; do
  for t in traces/resnet50_train.rmm.csv traces/gpt2_train.rmm.csv; do
    timeout 100 $PIN bin/gpumem --device $D bench --workload replay --trace $t --passes 8 --repeats 3 \
       --alloc pool-expandable,vpool --json 2>> "$O/bench2.err" | sed "s/^{/{\"round\":$round,/" >> "$O/pinned.jsonl"
  done
done
fi
if [[ ",$P," == *,torch,* ]]; then
echo "== torch replay ($(( $(date +%s) - t0 ))s)" >> "$S"
for v in 0 0.3 1.0; do bin/iterations_trace --vary $v --passes 6 --seed 42 > "$O/iter_$v.rmm.csv"; done
timeout 420 python3 python/bench/torch_trace_replay.py traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv \
  --passes 6 --repeats 3 --out "$O/torch.jsonl" > "$O/torch.log" 2>&1
timeout 300 python3 python/bench/torch_trace_replay.py "$O"/iter_0.rmm.csv "$O"/iter_0.3.rmm.csv "$O"/iter_1.0.rmm.csv \
  --split-passes --repeats 3 --out "$O/torch.jsonl" >> "$O/torch.log" 2>&1
echo "torch replay rc=$?" >> "$S"
rm -f "$O"/iter_*.rmm.csv
fi
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
import os
lines = lambda n: open(f"{o}/{n}").readlines() if os.path.exists(f"{o}/{n}") else []
for l in lines("threads.jsonl"):
    r = json.loads(l)
    p = " ".join(f"{x:.0f}" for x in r.get("pass_ns_per_op") or [])
    rl = r.get("reserved_over_live")
    print(f"t{r['threads']:<3} {r['alloc']:15} [{p}] steady {r.get('steady_ns_per_op') or 0:.0f} maps {r.get('vmm_mappings')} res/live {rl if rl is None else round(rl, 2)} {r.get('error') or ''}")
for l in lines("bench.jsonl"):
    r = json.loads(l)
    f = lambda k: f"{r[k]:.0f}" if isinstance(r.get(k), (int, float)) else "-"
    rl = r.get("reserved_over_live")
    tag = f"vary={r.get('vary')}" if r['workload'] == 'iterations' else r.get('params', '').split()[0][6:16]
    print(f"{tag:12} {r['alloc']:15} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} res/live {rl if rl is None else round(rl, 3)} {r.get('error') or ''}")
rows = [json.loads(l) for l in lines("capi.jsonl")]
for s in ("created", "legacy"):
    for path in ("resource", "stack", "capi"):
        v = [r for r in rows if r["stream"] == s and r["path"] == path]
        if not v:
            continue
        ov = [r["overhead_paired_ns_per_call"] for r in v if r.get("overhead_paired_ns_per_call") is not None]
        print(f"capi {s:8} {path:8} ns/call median {st.median(r['ns_per_call'] for r in v):6.1f}" + (f" paired overhead median {st.median(ov):5.2f} {[round(x, 1) for x in ov]}" if ov else ""))
rows = [json.loads(l) for l in lines("pinned.jsonl")]
for t in ("resnet50_t", "gpt2_train"):
    for a in ("pool-expandable", "vpool"):
        sel = [r for r in rows if r['alloc'] == a and r['params'].split()[0][6:16] == t]
        if sel:
            print(f"pinned {t} {a:15} first {st.median(r['first_ns_per_op'] for r in sel):.0f} second {st.median(r['second_ns_per_op'] for r in sel):.0f} steady {st.median(r['steady_ns_per_op'] for r in sel):.0f} [{' '.join(str(round(r['steady_ns_per_op'])) for r in sel)}] res/live {st.median(r['reserved_over_live'] for r in sel):.4f} (n={len(sel)})")
for l in lines("torch.jsonl"):
    r = json.loads(l)
    f = lambda k: f"{r[k]:.0f}" if isinstance(r.get(k), (int, float)) else "-"
    print(f"torch {str(r.get('trace', ''))[-22:]:22} first {f('first'):>6} second {f('second'):>5} steady {f('steady'):>5} res/live {round(r.get('reserved_over_live') or 0, 3)}")
PY
for f in "$O"/*.err; do tail -3 "$f"; done >> "$S"
cat "$S"
