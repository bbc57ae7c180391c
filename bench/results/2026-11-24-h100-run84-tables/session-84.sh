#!/usr/bin/env bash
# Run 84 (issue 19): issue 19's tables on one build (5f5411a): the Rust
# suite; threads (8 and 16), iterations (vary 0, 0.3, 1) and both traces
# (6 passes: first, second, steady) for every allocator but `cuda`
# (cudaMalloc, about 50 µs per operation); the C ABI's cost per call over
# the Rust pool on a created stream and on the legacy default stream.
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
A=cuda-async,pool,pool-expandable,pool-sharded,pool-recycling,arena,caching,binning,vpool,vpool-sharded
echo "== threads ($(( $(date +%s) - t0 ))s)" >> "$S"
for n in 8 16; do
  timeout 240 bin/gpumem --device cuda bench --workload threads --threads $n --ops 200000 --warm --passes 12 --repeats 3 \
    --alloc $A --json 2>> "$O/bench.err" | sed "s/^{/{\"threads\":$n,/" >> "$O/threads.jsonl"
done
echo "== iterations and traces ($(( $(date +%s) - t0 ))s)" >> "$S"
for v in 0 0.3 1.0; do
  timeout 150 bin/gpumem --device cuda bench --workload iterations --vary $v --passes 6 --repeats 3 \
     --alloc $A --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
done
for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
  timeout 150 bin/gpumem --device cuda bench --workload replay --trace $t --passes 6 --repeats 3 \
     --alloc $A --json >> "$O/bench.jsonl" 2>> "$O/bench.err"
done
echo "== capi ($(( $(date +%s) - t0 ))s)" >> "$S"
for r in $(seq 1 8); do
  timeout 60 taskset -c 5 bin/gpumem --device cuda capi-cost --conf resource=pool --pairs 50000 --runs 31 --json \
    | sed "s/^{/{\"stream\":\"created\",\"round\":$r,/" >> "$O/capi.jsonl" 2>> "$O/capi.err"
  timeout 60 taskset -c 5 bin/gpumem --device cuda capi-cost --conf resource=pool --legacy-stream --pairs 50000 --runs 31 --json \
    | sed "s/^{/{\"stream\":\"legacy\",\"round\":$r,/" >> "$O/capi.jsonl" 2>> "$O/capi.err"
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
for l in open(f"{o}/threads.jsonl"):
    r = json.loads(l)
    p = " ".join(f"{x:.0f}" for x in r.get("pass_ns_per_op") or [])
    rl = r.get("reserved_over_live")
    print(f"t{r['threads']:<3} {r['alloc']:15} [{p}] steady {r.get('steady_ns_per_op') or 0:.0f} maps {r.get('vmm_mappings')} res/live {rl if rl is None else round(rl, 2)} {r.get('error') or ''}")
for l in open(f"{o}/bench.jsonl"):
    r = json.loads(l)
    f = lambda k: f"{r[k]:.0f}" if isinstance(r.get(k), (int, float)) else "-"
    rl = r.get("reserved_over_live")
    tag = f"vary={r.get('vary')}" if r['workload'] == 'iterations' else r.get('params', '').split()[0][6:16]
    print(f"{tag:12} {r['alloc']:15} first {f('first_ns_per_op'):>6} second {f('second_ns_per_op'):>5} steady {f('steady_ns_per_op'):>5} res/live {rl if rl is None else round(rl, 3)} {r.get('error') or ''}")
rows = [json.loads(l) for l in open(f"{o}/capi.jsonl")]
for s in ("created", "legacy"):
    for path in ("resource", "stack", "capi"):
        v = [r for r in rows if r["stream"] == s and r["path"] == path]
        ov = [r["overhead_paired_ns_per_call"] for r in v if r.get("overhead_paired_ns_per_call") is not None]
        print(f"capi {s:8} {path:8} ns/call median {st.median(r['ns_per_call'] for r in v):6.1f}" + (f" paired overhead median {st.median(ov):5.2f} {[round(x, 1) for x in ov]}" if ov else ""))
PY
tail -3 "$O/bench.err" "$O/capi.err" >> "$S"
cat "$S"
