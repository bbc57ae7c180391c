#!/usr/bin/env bash
# Run 96: the fixes of the 2026-11-25 user audit (pinned pool, aligned
# adaptor, device buffers, CuPy frees, the C ABI's configuration, arena
# sizes, graph-pool peaks) on the GPU. First the whole Rust suite against the
# real driver (the pinned pool now asks cuPointerGetAttribute whether a copy's
# device side is pinned host memory), then the C ABI's own cost per call for
# `pool` and `vpool` (gpumem_free now looks whether CuPy holds blocks), 8
# rounds. pytest runs in a second call (pytest-96.sh).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
bash ./run-tests.sh "$O/tests" > "$O/tests.out" 2>&1
grep -v "rc=0 " "$O/tests.out" > "$S"
PIN="taskset -c 5"; (( $(nproc) > 5 )) || PIN=""
t0=$(date +%s)
for round in $(seq 1 8); do
  for r in pool vpool; do
    timeout 60 $PIN bin/gpumem --device cuda capi-cost --conf resource=$r --pairs 50000 --runs 15 --json 2>> "$O/capi.err" \
      | sed "s/^{/{\"round\":$round,\"r\":\"$r\",/" >> "$O/capi.jsonl"
  done
  (( $(date +%s) - t0 > 150 )) && break
done
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st, collections
o = sys.argv[1]
c = collections.defaultdict(list)
for l in open(f"{o}/capi.jsonl"):
    if l.startswith("{"):
        r = json.loads(l)
        c[(r["r"], r["path"])].append(r)
for (res, path), rows in sorted(c.items()):
    ns = [r["ns_per_call"] for r in rows]
    over = [r.get("overhead_paired_ns_per_call") for r in rows if r.get("overhead_paired_ns_per_call") is not None]
    line = f"{res:5} {path:8} ns/call median {st.median(ns):6.2f} ({min(ns):.2f}..{max(ns):.2f}, {len(ns)} rounds)"
    if over and path != "resource":
        line += f"  paired overhead over resource median {st.median(over):+.2f} ({min(over):+.2f}..{max(over):+.2f})"
    print(line)
PY
cat "$S"
