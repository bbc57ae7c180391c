#!/usr/bin/env bash
# Run 82 (issue 19): the C ABI's per-call cost on the legacy default stream
# (handle 0, PyTorch's default), 12 rounds, and with 8 threads on their own
# streams, 6 rounds; d7eafde (bin/gpumem-base) against 7ba1588, alternating.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
for r in $(seq 1 12); do
  for b in gpumem-base gpumem; do
    timeout 60 taskset -c 5 bin/$b --device cuda capi-cost --conf resource=pool --legacy-stream --pairs 50000 --runs 31 --json \
      | sed "s/^{/{\"build\":\"$b\",\"round\":$r,/" >> "$O/capi-legacy.jsonl" 2>> "$O/capi.err"
  done
done
for r in $(seq 1 6); do
  for b in gpumem-base gpumem; do
    timeout 60 bin/$b --device cuda capi-cost --conf resource=pool --threads 8 --pairs 50000 --runs 15 --json \
      | sed "s/^{/{\"build\":\"$b\",\"round\":$r,/" >> "$O/capi-threads.jsonl" 2>> "$O/capi.err"
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
for f in ("capi-legacy", "capi-threads"):
    rows = [json.loads(l) for l in open(f"{o}/{f}.jsonl")]
    for b in ('gpumem-base', 'gpumem'):
        for path in ("resource", "stack", "capi"):
            v = [r for r in rows if r['build'] == b and r['path'] == path]
            ns = st.median(r['ns_per_call'] for r in v)
            ov = [r['overhead_paired_ns_per_call'] for r in v if r['overhead_paired_ns_per_call'] is not None]
            print(f"{f:12} {b:11} {path:8} median ns/call {ns:6.1f}" + (f"  paired overhead median {st.median(ov):5.2f} {[round(x,1) for x in ov]}" if ov else ""))
PY
tail -3 "$O/capi.err" >> "$S"
cat "$S"
