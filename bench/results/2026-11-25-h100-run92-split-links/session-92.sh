#!/usr/bin/env bash
# Run 92 (issue 19): the split's and the merge's link updates without a
# branch on whether the block was its range's last (bin/gpumem) against
# c1d1acc (bin/gpumem-base). The Rust suite on the GPU first; then run
# 91b's paired rounds: every round runs each workload once with each
# build, back to back, 16 rounds (pool-expandable, 4 passes, 3 repeats),
# and the C ABI's cost likewise; the summary pairs each round's two runs.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
PIN="taskset -c 5"; (( $(nproc) > 5 )) || PIN=""
t0=$(date +%s)
timeout 300 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -8 >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
echo "== bench ($(( $(date +%s) - t0 ))s)" >> "$S"
for round in $(seq 1 16); do
  for w in gpt2 resnet 0 0.3 1.0; do
    for b in gpumem-base gpumem; do
      case $w in
        gpt2) args="--workload replay --trace traces/gpt2_train.rmm.csv" ;;
        resnet) args="--workload replay --trace traces/resnet50_train.rmm.csv" ;;
        *) args="--workload iterations --vary $w" ;;
      esac
      timeout 60 $PIN bin/$b --device cuda bench $args --passes 4 --repeats 3 --alloc pool-expandable --json 2>> "$O/bench.err" \
        | sed "s/^{/{\"build\":\"$b\",\"round\":$round,\"w\":\"$w\",/" >> "$O/bench.jsonl"
    done
  done
  for b in gpumem-base gpumem; do
    timeout 60 $PIN bin/$b --device cuda capi-cost --conf resource=pool --pairs 50000 --runs 15 --json 2>> "$O/capi.err" \
      | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/capi.jsonl"
  done
  (( $(date +%s) - t0 > 420 )) && break
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st, collections
o = sys.argv[1]
rows = [json.loads(l) for l in open(f"{o}/bench.jsonl") if l.startswith("{")]
by = collections.defaultdict(dict)
for r in rows:
    by[(r["w"], r["round"])][r["build"]] = r
for w in ("gpt2", "resnet", "0", "0.3", "1.0"):
    for k in ("second_ns_per_op", "steady_ns_per_op"):
        pairs = [(v["gpumem-base"][k], v["gpumem"][k]) for (ww, _), v in sorted(by.items())
                 if ww == w and "gpumem" in v and "gpumem-base" in v]
        if not pairs:
            continue
        ratios = [n / b for b, n in pairs]
        print(f"{w:7} {k.split('_')[0]:6} base {st.median(b for b, _ in pairs):6.1f} new {st.median(n for _, n in pairs):6.1f}"
              f"  paired ratio median {st.median(ratios):.3f}  new faster in {sum(r < 1 for r in ratios)}/{len(ratios)}"
              f"  lower quartiles {sorted(b for b, _ in pairs)[len(pairs) // 4]:.0f} / {sorted(n for _, n in pairs)[len(pairs) // 4]:.0f}")
c = collections.defaultdict(dict)
for l in open(f"{o}/capi.jsonl"):
    r = json.loads(l)
    c[(r["path"], r["round"])][r["build"]] = r
for p in ("resource", "capi", "stack"):
    for k in ("ns_per_call", "overhead_paired_ns_per_call"):
        pairs = [(v["gpumem-base"][k], v["gpumem"][k]) for (pp, _), v in sorted(c.items())
                 if pp == p and len(v) == 2]
        if p == "resource" and k != "ns_per_call":
            continue
        print(f"capi {p:8} {k:28} base {st.median(b for b, _ in pairs):6.2f} new {st.median(n for _, n in pairs):6.2f}"
              f"  paired diff median {st.median(n - b for b, n in pairs):+.2f} (n={len(pairs)})")
PY
cat "$S"
