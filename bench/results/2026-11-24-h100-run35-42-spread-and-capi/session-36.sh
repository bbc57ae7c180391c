#!/usr/bin/env bash
# Run 36 (issue 19, item 5): the C ABI's cost A/B, pinned to one core; pytest on CUDA, verbose.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
echo "== capi-cost A/B ($(( $(date +%s) - t0 ))s)" | tee -a "$S"
for round in 1 2 3 4 5; do
  for b in gpumem-base gpumem; do
    for c in pool vpool caching arena; do
      timeout 60 taskset -c 3 bin/$b --device cuda capi-cost --conf resource=$c --runs 11 --json 2>>"$O/capi.err" \
        | python3 -c "import sys,json
for l in sys.stdin:
    r=json.loads(l); r['build']='$b'; r['round']=$round; print(json.dumps(r))" >> "$O/capi-cost.jsonl"
    done
  done
done
echo "== pytest cuda" | tee -a "$S"
timeout 240 python3 -m pytest -v -p no:cacheprovider python/tests > "$O/pytest.log" 2>&1; echo "pytest rc=$?" >> "$S"
tail -1 "$O/pytest.log" >> "$S"
grep -v PASSED "$O/pytest.log" | grep -E "::" | tail -5 >> "$S"
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
PY
cat "$S"
