#!/usr/bin/env bash
# Run 95: the C ABI after its stream wrappers moved to a chain of tables and a
# served allocation tests its result once (40b92ad), against the build before
# (6e08cf2, bin/gpumem-base). 16 rounds; each round runs capi-cost once with
# each build, back to back, for `pool` and for `vpool`; the summary pairs each
# round's two runs before taking medians (the host moves between a fast and a
# slow state, run 87). Then 8 threads on their own streams, 2 rounds, and the
# Rust suite on the GPU. pytest runs in a second call (pytest-95.sh).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
PIN="taskset -c 5"; (( $(nproc) > 5 )) || PIN=""
t0=$(date +%s)
for round in $(seq 1 16); do
  for r in pool vpool; do
    for b in gpumem-base gpumem; do
      timeout 60 $PIN bin/$b --device cuda capi-cost --conf resource=$r --pairs 50000 --runs 15 --json 2>> "$O/capi.err" \
        | sed "s/^{/{\"build\":\"$b\",\"round\":$round,\"r\":\"$r\",/" >> "$O/capi.jsonl"
    done
  done
  (( $(date +%s) - t0 > 200 )) && break
done
for round in 1 2; do
  for r in pool vpool; do
    for b in gpumem-base gpumem; do
      timeout 60 bin/$b --device cuda capi-cost --conf resource=$r --threads 8 --pairs 20000 --runs 7 --json 2>> "$O/capi.err" \
        | sed "s/^{/{\"build\":\"$b\",\"round\":$round,\"r\":\"$r\",/" >> "$O/threads.jsonl"
    done
  done
done
echo "== capi done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st, collections
o = sys.argv[1]
for name, f in (("1 thread", "capi.jsonl"), ("8 threads", "threads.jsonl")):
    c = collections.defaultdict(dict)
    for l in open(f"{o}/{f}"):
        if not l.startswith("{"):
            continue
        r = json.loads(l)
        c[(r["r"], r["path"], r["round"])][r["build"]] = r
    for res in ("pool", "vpool"):
        for p in ("resource", "capi", "stack"):
            for k in ("ns_per_call", "overhead_paired_ns_per_call"):
                pairs = [(v["gpumem-base"][k], v["gpumem"][k]) for (rr, pp, _), v in sorted(c.items())
                         if rr == res and pp == p and len(v) == 2]
                if not pairs or (p == "resource" and k != "ns_per_call"):
                    continue
                print(f"{name:9} {res:5} {p:8} {k:28} base {st.median(b for b, _ in pairs):6.2f} new {st.median(n for _, n in pairs):6.2f}"
                      f"  paired diff median {st.median(n - b for b, n in pairs):+.2f}  new lower in {sum(n < b for b, n in pairs)}/{len(pairs)}")
PY
bash ./run-tests.sh "$O/tests" > "$O/tests.out" 2>&1
tail -3 "$O/tests.out" >> "$S"
cat "$S"
