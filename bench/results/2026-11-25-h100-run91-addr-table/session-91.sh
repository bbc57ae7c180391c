#!/usr/bin/env bash
# Run 91 (issue 19): AddrTable's load at most 1/8 while small (c1d1acc,
# bin/gpumem) against at most 1/2 (df56583, bin/gpumem-base). The Rust
# suite on the GPU; then, pinned to one CPU, six rounds with the builds in
# turn: iterations (vary 0, 0.3, 1) and both traces through pool-expandable
# (the C ABI's default) and vpool, 6 passes, 3 repeats; the C ABI's cost
# (4 rounds each); 8 and 16 threads (2 rounds each).
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
for round in 1 2 3 4 5 6; do
  for b in gpumem-base gpumem; do
    for t in traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv; do
      timeout 100 $PIN bin/$b --device cuda bench --workload replay --trace $t --passes 6 --repeats 3 \
         --alloc pool-expandable,vpool --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/bench.jsonl"
    done
    for v in 0 0.3 1.0; do
      timeout 100 $PIN bin/$b --device cuda bench --workload iterations --vary $v --passes 6 --repeats 3 \
         --alloc pool-expandable,vpool --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/bench.jsonl"
    done
  done
done
echo "== capi ($(( $(date +%s) - t0 ))s)" >> "$S"
for round in 1 2 3 4; do
  for b in gpumem-base gpumem; do
    timeout 60 $PIN bin/$b --device cuda capi-cost --conf resource=pool --pairs 50000 --runs 31 --json 2>> "$O/capi.err" \
      | sed "s/^{/{\"build\":\"$b\",\"round\":$round,/" >> "$O/capi.jsonl"
  done
done
echo "== threads ($(( $(date +%s) - t0 ))s)" >> "$S"
for round in 1 2; do
  for b in gpumem-base gpumem; do
    for n in 8 16; do
      timeout 120 bin/$b --device cuda bench --workload threads --threads $n --ops 200000 --warm --passes 12 --repeats 3 \
        --alloc pool-expandable,vpool --json 2>> "$O/bench.err" | sed "s/^{/{\"build\":\"$b\",\"round\":$round,\"threads\":$n,/" >> "$O/threads.jsonl"
    done
  done
done
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
python3 - "$O" >> "$S" <<'PY'
import json, sys, statistics as st, collections
o = sys.argv[1]
def rows(name):
    try:
        return [json.loads(l) for l in open(f"{o}/{name}") if l.startswith("{")]
    except OSError:
        return []
def tag(r):
    w = r["workload"]
    if w == "iterations":
        return f"vary={r.get('vary')}"
    if w == "threads":
        return f"threads={r.get('threads')}"
    return r.get("params", "").split()[0][6:16]
groups = collections.defaultdict(list)
for r in rows("bench.jsonl") + rows("threads.jsonl"):
    if r.get("error"):
        print("error", r["build"], tag(r), r["alloc"], r["error"])
        continue
    groups[(tag(r), r["alloc"], r["build"])].append(r)
med = lambda sel, k: st.median(x[k] for x in sel if isinstance(x.get(k), (int, float)))
for (t, a, b) in sorted(groups):
    if b != "gpumem":
        continue
    base, new = groups.get((t, a, "gpumem-base"), []), groups[(t, a, b)]
    if not base:
        continue
    line = f"{t:12} {a:15}"
    for k in ("first_ns_per_op", "second_ns_per_op", "steady_ns_per_op"):
        try:
            mb, mn = med(base, k), med(new, k)
            line += f" {k.split('_')[0]} {mb:.0f}->{mn:.0f} ({mn / mb:.3f})"
        except st.StatisticsError:
            pass
    rl = lambda sel: max(x.get("reserved_over_live") or 0 for x in sel)
    line += f" res/live {rl(base):.4f}->{rl(new):.4f} n={len(base)}/{len(new)}"
    print(line)
c = collections.defaultdict(list)
for r in rows("capi.jsonl"):
    c[(r["path"], r["build"])].append(r)
for (p, b), sel in sorted(c.items()):
    print(f"capi {p:9} {b:12} ns/call {st.median(x['ns_per_call'] for x in sel):.2f} "
          f"paired overhead {st.median(x['overhead_paired_ns_per_call'] for x in sel):.2f} n={len(sel)}")
PY
tail -n 3 "$O/bench.err" "$O/capi.err" 2>/dev/null >> "$S"
cp "$O/summary.txt" "$O/summary.copy" 2>/dev/null
cat "$S"
