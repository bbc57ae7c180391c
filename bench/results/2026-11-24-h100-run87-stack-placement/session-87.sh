#!/bin/bash
# Run 87: is the C ABI's "slow host state" the process's stack placement?
# capi-cost under ASLR off (setarch -R) with the environment padded by PAD
# bytes (moves the initial stack), and with ASLR on; perf counters if any.
cd "$(dirname "$0")"
B=./gpumem
O=${OUT:-/tmp/out}; mkdir -p $O
{ lscpu; uname -a; which perf setarch taskset; perf stat -e cycles,instructions true; } > $O/probe.txt 2>&1
perf list 2>/dev/null | grep -iE "alias|store_forward|ld_blocks|machine_clears|l1d\.|dtlb_load" | head -40 >> $O/probe.txt
one() { # pad extra-args...
  local pad=$1; shift
  V=$(head -c $pad /dev/zero | tr '\0' x)
  PADV=$V "$@" $B --device cuda capi-cost --pairs 20000 --runs 9 --json 2>/dev/null | python3 -c "
import json,sys
r={d['path']:d for d in map(json.loads,sys.stdin)}
print($pad, round(r['resource']['ns_per_call'],1), round(r['stack']['ns_per_call'],1), round(r['capi']['ns_per_call'],1), round(r['capi']['overhead_paired_ns_per_call'],2))"
}
for pad in $(seq 0 32 4095); do one $pad setarch -R taskset -c 5; done > $O/pads-noaslr.txt
for i in $(seq 1 24); do one 0 taskset -c 5; done > $O/aslr.txt
# perf on eight pads, if perf works
if perf stat -e cycles true >/dev/null 2>&1; then
  EV=cycles,instructions
  for e in ld_blocks_partial.address_alias ld_blocks.store_forward machine_clears.memory_ordering l1d.replacement mem_load_retired.l1_miss; do
    perf stat -e $e true >/dev/null 2>&1 && EV=$EV,$e
  done
  echo "events $EV" > $O/perf.txt
  for pad in 0 96 512 1024 1536 2048 2560 3072; do
    V=$(head -c $pad /dev/zero | tr '\0' x)
    echo "== pad $pad" >> $O/perf.txt
    PADV=$V setarch -R taskset -c 5 perf stat -x, -e $EV $B --device cuda capi-cost --path resource --pairs 200000 --runs 9 --json >> $O/perf.txt 2>&1
  done
fi
python3 - $O <<'PY'
import sys,statistics as st
O=sys.argv[1]
for f in ('pads-noaslr.txt','aslr.txt'):
    rows=[list(map(float,l.split())) for l in open(f'{O}/{f}') if l.strip()]
    if not rows: print(f,'empty'); continue
    res=[r[1] for r in rows]; m=st.median(res)
    cut=(min(res)+max(res))/2
    fast=[r for r in rows if r[1]<cut]; slow=[r for r in rows if r[1]>=cut]
    print(f, 'runs',len(rows),'resource min/median/max',min(res),m,max(res),'fast',len(fast),'slow',len(slow))
    for name,g in (('fast',fast),('slow',slow)):
        if g: print('  ',name,'resource',st.median([r[1] for r in g]),'stack',st.median([r[2] for r in g]),'capi',st.median([r[3] for r in g]),'overhead',st.median([r[4] for r in g]))
PY
