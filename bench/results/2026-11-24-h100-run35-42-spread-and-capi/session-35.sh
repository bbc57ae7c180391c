#!/usr/bin/env bash
# Run 35 (issue 19, item 5): the C ABI's cost with statistics under the pool's lock.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
echo "== tests" | tee -a "$S"
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
echo "== pytest cuda ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
timeout 150 python3 -m pytest -q -p no:cacheprovider python/tests > "$O/pytest.log" 2>&1; echo "pytest rc=$?" >> "$S"
tail -1 "$O/pytest.log" >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt pytest.log && rm -rf tests tests-summary.txt pytest.log)
echo "== capi-cost A/B ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
for round in 1 2 3; do
  for b in gpumem-base gpumem; do
    for c in pool vpool caching arena; do
      timeout 60 bin/$b --device cuda capi-cost --conf resource=$c --json 2>>"$O/capi.err" \
        | python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$b'; r['round']=$round; print(json.dumps(r))" >> "$O/capi-cost.jsonl"
    done
  done
done
echo "== torch speed ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
timeout 240 python3 python/bench/torch_allocators.py speed --configs torch,native:pool --out "$O/torch_speed.jsonl" > "$O/torch.log" 2>&1
echo "torch speed rc=$?" >> "$S"
echo "== done in $(( $(date +%s) - t0 ))s" | tee -a "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
rows = [json.loads(l) for l in open(f"{o}/capi-cost.jsonl")]
def conf_is(r, c):
    return r["conf"] == f"resource={c}" or r["conf"].startswith(f"resource={c},")
for c in ["pool", "vpool", "caching", "arena"]:
    for b in ["gpumem-base", "gpumem"]:
        for p in ["resource", "stack", "capi"]:
            sel = [r for r in rows if r["build"] == b and r["path"] == p and conf_is(r, c)]
            if sel:
                v = st.median(r["ns_per_call"] for r in sel)
                ov = st.median(r["overhead_ns_per_call"] or 0 for r in sel)
                print(f"capi-cost {c:8} {b:12} {p:8} ns/call {v:6.1f} over {ov:+5.1f}  rounds {len(sel)}")
for l in open(f"{o}/torch_speed.jsonl"):
    r = json.loads(l)
    print(f"torch {r['model']} {r['config']}: s/iter {r['s_per_iter']:.5f} peak_reserved {r['peak_reserved']/1e9:.2f} GB")
PY
tail -3 "$O/torch.log" >> "$S"
cat "$S"
