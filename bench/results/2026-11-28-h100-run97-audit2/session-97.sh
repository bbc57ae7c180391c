#!/usr/bin/env bash
# Run 97: the second audit's fixes (PinnedPool's legacy-stream frees and
# foreign streams, DeviceBuffer::set_stream, HoldingAdaptor's bad frees; the
# C ABI's graph holds, deferred frees around captures, graph-pool
# statistics and snapshots) on the GPU, in one call: the Rust suite against
# the real driver, the Python package's tests with PyTorch and CuPy (skip
# reasons listed), then the C ABI's own cost per call (gpumem_free reads one
# more atomic: whether blocks are held for graphs).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
bash ./run-tests.sh "$O/tests" > "$O/tests.out" 2>&1
grep -v "rc=0 " "$O/tests.out" > "$S"
echo "rust suite: $(( $(date +%s) - t0 )) s" >> "$S"
t1=$(date +%s)
GPUMEM_DEVICE=cuda GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python PATH=$B/bin:$PATH \
  timeout 470 python3 -m pytest -q -rs -p no:cacheprovider python/tests > "$O/pytest.log" 2>&1
echo "pytest rc=$? in $(( $(date +%s) - t1 )) s: $(tail -1 "$O/pytest.log")" >> "$S"
PIN="taskset -c 5"; (( $(nproc) > 5 )) || PIN=""
t2=$(date +%s)
for round in $(seq 1 6); do
  for r in pool vpool; do
    timeout 30 $PIN bin/gpumem --device cuda capi-cost --conf resource=$r --pairs 50000 --runs 15 --json 2>> "$O/capi.err" \
      | sed "s/^{/{\"round\":$round,\"r\":\"$r\",/" >> "$O/capi.jsonl"
  done
  (( $(date +%s) - t0 > 560 || $(date +%s) - t2 > 60 )) && break
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
    over = [r["overhead_paired_ns_per_call"] for r in rows if r.get("overhead_paired_ns_per_call") is not None]
    line = f"{res:5} {path:8} ns/call median {st.median(ns):6.2f} ({min(ns):.2f}..{max(ns):.2f}, {len(ns)} rounds)"
    if over and path != "resource":
        line += f"  paired overhead median {st.median(over):+.2f} ({min(over):+.2f}..{max(over):+.2f})"
    print(line)
PY
cat "$S"
