#!/usr/bin/env bash
# Replays the traces through two `gpumem` binaries (an old and a new build)
# on the same GPU in one run, alternating them for several rounds (old first
# in odd rounds, new first in even ones) so drift and position hit both alike, and prints the median ns per operation of each with
# new/old. JSON lines go to OUT_DIR/compare.jsonl.
#
# Usage: compare-binaries.sh OLD_BIN NEW_BIN OUT_DIR TRACE...
# Env: ALLOCS (default pool,vpool,caching,arena), OLD_ALLOCS (default
# ALLOCS: the same allocators as OLD_BIN spells them, in ALLOCS's order; a
# binary from before 2026-11-29 has the old names, in which `pool` was
# today's `pool+expandable=false` and today's `pool` was `pool-expandable`,
# so compare it with ALLOCS=pool,async OLD_ALLOCS=pool-expandable,cuda-async;
# its rows are reported under ALLOCS's names), REPEATS (default 5),
# ROUNDS (default 3), MODES (default "cold warm": cold is the first pass,
# warm the pass after one untimed one, steady the pass after WARM_PASSES
# untimed ones, default 8), DEVICE (default cuda; sim for a dry run).
set -uo pipefail
old=$1 new=$2 out=$3
shift 3
mkdir -p "$out"
allocs=${ALLOCS:-pool,vpool,caching,arena}
old_allocs=${OLD_ALLOCS:-$allocs}
if [[ $(tr -cd , <<<"$allocs") != $(tr -cd , <<<"$old_allocs") ]]; then
  echo "OLD_ALLOCS ($old_allocs) must name as many allocators as ALLOCS ($allocs)" >&2
  exit 2
fi
for round in $(seq "${ROUNDS:-3}"); do
  order="old new"; (( round % 2 == 0 )) && order="new old"
  for which in $order; do
    bin=$old list=$old_allocs
    [[ $which == new ]] && bin=$new list=$allocs
    for trace in "$@"; do
      for mode in ${MODES:-cold warm}; do
        flag=()
        [[ $mode == warm ]] && flag=(--warm)
        [[ $mode == steady ]] && flag=(--warm-passes "${WARM_PASSES:-8}")
        "$bin" replay "$trace" --device "${DEVICE:-cuda}" --alloc "$list" --repeats "${REPEATS:-5}" --json "${flag[@]}" 2>>"$out/compare.err" |
          sed "s/^{/{\"binary\":\"$which\",\"round\":$round,\"pass\":\"$mode\",\"trace_file\":\"$(basename "$trace")\",/" >>"$out/compare.jsonl"
      done
    done
  done
done
python3 - "$out/compare.jsonl" "$old_allocs" "$allocs" <<'PY'
import json, statistics, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# The old binary's names, reported under the new binary's.
renamed = dict(zip(sys.argv[2].split(","), sys.argv[3].split(",")))
def alloc(r):
    name = r.get("allocator", r.get("alloc"))
    return renamed.get(name, name) if r["binary"] == "old" else name
key = lambda r: (r["trace_file"], alloc(r), r["pass"])
ns = defaultdict(lambda: defaultdict(list))
for r in rows:
    v = r.get("ns_per_op") or r.get("median_ns_per_op")
    if v is not None:
        ns[key(r)][r["binary"]].append(v)
print(f"{'trace':28} {'alloc':8} {'pass':5} {'old ns/op':>10} {'new ns/op':>10} {'new/old':>8}")
for k in sorted(ns):
    o, n = ns[k].get("old"), ns[k].get("new")
    if o and n:
        mo, mn = statistics.median(o), statistics.median(n)
        print(f"{k[0]:28} {k[1]:8} {k[2]:5} {mo:10.1f} {mn:10.1f} {mn / mo:8.3f}")
PY
