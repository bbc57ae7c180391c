#!/usr/bin/env bash
# The whole GPU verification in one command, run from inside gpu-bundle on the
# GPU machine: the test suite against the real driver, the examples that need a
# GPU, and the benchmarks, replays and plots. Writes everything under OUT_DIR
# (default ./out) and prints a short summary last.
#
# Usage: gpu-bundle/gpu-run.sh [OUT_DIR] [PARTS]   PARTS: comma list of
#   tests,stress,examples,bench,replay,plot,python,torch,torchbench,vpool,steady
#   (default: all but steady, which is the short form of vpool's steady-state
#   replays)
# STRESS_SECS (default 20): seconds per pool of the stress part.
set -uo pipefail
cd "$(dirname "$0")"
out=${1:-out}
parts=${2:-tests,stress,examples,bench,replay,plot,python,torch,torchbench,vpool}
mkdir -p "$out/logs"
dev=${GPUMEM_RUN_DEVICE:-cuda}   # sim: a dry run of this script on a CPU machine
export GPUMEM_DEVICE=$dev
[[ -f fonts/DejaVuSans.ttf ]] && export GPUMEM_FONT=$PWD/fonts/DejaVuSans.ttf
summary=()
note() { summary+=("$*"); echo "== $*"; }
want() { [[ ",$parts," == *",$1,"* ]]; }
date=$(date -u +%Y-%m-%d)

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/logs/nvidia-smi.txt"
{ grep -m1 'model name' /proc/cpuinfo; nproc; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null; } >"$out/logs/host.txt" 2>&1

if want tests; then
  ./run-tests.sh "$out/logs/tests" > "$out/logs/tests-summary.txt" 2>&1
  note "tests: $(tail -1 "$out/logs/tests-summary.txt")"
fi

if want stress; then
  # The concurrent stress of every pool and of the C ABI, longer than in CI.
  for t in tests/stress-*; do
    GPUMEM_STRESS_SECS=${STRESS_SECS:-20} "$t" --test-threads=1 --nocapture \
      >"$out/logs/$(basename "$t").log" 2>&1
    note "stress $(basename "$t" | cut -d- -f1): rc=$?"
  done
  grep -ho 'stress: .*bytes verified' "$out"/logs/stress-*.log >"$out/stress.txt"
  while read -r l; do note "$l"; done <"$out/stress.txt"
fi

run_example() { # name, expectation
  local name=$1
  [[ -x bin/$name ]] || { note "example $name: not built"; return; }
  bin/"$name" >"$out/logs/ex-$name.out" 2>"$out/logs/ex-$name.err"
  local rc=$?
  note "example $name: rc=$rc stderr_bytes=$(wc -c <"$out/logs/ex-$name.err") | $(tail -1 "$out/logs/ex-$name.out")"
}
if want examples; then
  for ex in static_pool_exit async_default_pool async_custom_pool async_trim ipc_pool cudarc_kernel; do
    run_example "$ex"
  done
  bin/gpumem --device "$dev" transfer --json >"$out/transfer.jsonl" 2>"$out/logs/transfer.err"
  note "transfer: rc=$? lines=$(wc -l <"$out/transfer.jsonl")"
  bin/gpumem --device "$dev" transfer >"$out/logs/transfer.txt" 2>&1
fi

if want bench; then
  # 64k holes through cuMemAlloc itself would take minutes: the driver
  # allocators' hole cost is their per-call cost, measured by the other workloads.
  pools=$(bin/gpumem bench --list-allocators | grep -vx cuda | paste -sd,)
  for mode in cold warm; do
    flag=(); [[ $mode == warm ]] && flag=(--warm)
    f="$out/bench-$mode.jsonl"
    bin/gpumem --device "$dev" bench --workload same,random,threads --repeats 3 "${flag[@]}" --json >"$f" 2>>"$out/logs/bench.err"
    bin/gpumem --device "$dev" bench --workload same --size 256 --repeats 3 "${flag[@]}" --json >>"$f" 2>>"$out/logs/bench.err"
    bin/gpumem --device "$dev" bench --workload holes --holes 65536 --alloc "$pools" --repeats 3 "${flag[@]}" --json >>"$f" 2>>"$out/logs/bench.err"
    bin/gpumem --device "$dev" bench --workload holes --holes 4096 --alloc cuda --repeats 3 "${flag[@]}" --json >>"$f" 2>>"$out/logs/bench.err"
    note "bench $mode: lines=$(wc -l <"$f") errors=$(grep -c '"error":"' "$f")"
  done
fi

if want replay; then
  for tr in traces/*.csv; do
    bin/gpumem --device "$dev" replay "$tr" --repeats 3 --json >>"$out/replay-cold.jsonl" 2>>"$out/logs/replay.err"
    bin/gpumem --device "$dev" replay "$tr" --repeats 3 --warm --json >>"$out/replay-warm.jsonl" 2>>"$out/logs/replay.err"
  done
  note "replay: cold lines=$(wc -l <"$out/replay-cold.jsonl") warm lines=$(wc -l <"$out/replay-warm.jsonl")"
  bin/gpumem --device "$dev" replay traces/resnet50_train.rmm.csv --alloc pool --log "$out/logs/resnet50.pool.log.csv" >/dev/null 2>>"$out/logs/replay.err"
  note "replay log: $(python3 - "$out/logs/resnet50.pool.log.csv" traces/resnet50_train.rmm.csv <<'PY'
import csv, sys
a = list(csv.reader(open(sys.argv[1]))); b = list(csv.reader(open(sys.argv[2])))
same = a[0] == b[0] and [r[2] for r in a[1:]] == [r[2] for r in b[1:]] and [r[4] for r in a[1:]] == [r[4] for r in b[1:]]
print(f"header, actions and sizes identical to the input: {same} ({len(a)-1} rows vs {len(b)-1})")
PY
)"
fi

if want plot; then
  bin/gpumem --device "$dev" plot traces/gpt2_train.rmm.csv --alloc async,pool,caching,vpool -o "$out/gpt2_train.svg" >"$out/logs/plot.txt" 2>&1
  note "plot svg: rc=$?"
  bin/gpumem --device "$dev" plot traces/gpt2_train.rmm.csv --alloc async,pool,caching,vpool -o "$out/gpt2_train.png" >>"$out/logs/plot.txt" 2>&1
  note "plot png: rc=$?"
fi

if want python && [[ -d python ]]; then
  export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONPATH=$PWD/python
  for conf in resource=pool resource=async resource=caching resource=vpool; do
    for s in torch_resnet18_step torch_gpt2_step cupy_check; do
      log="$out/logs/py-$s-${conf#resource=}"
      GPUMEM_CONF=$conf python3 python/examples/$s.py >"$log.out" 2>"$log.err"
      rc=$?
      echo "GPUMEM_CONF=$conf $s rc=$rc | $(tail -1 "$log.out")" >>"$out/python.txt"
      note "python $s ($conf): rc=$rc | $(tail -1 "$log.out")"
    done
  done
fi

if want torch && [[ -d python ]]; then
  # gpumem as PyTorch's allocator: the Python suite on the GPU (the C ABI
  # parts with GPUMEM_DEVICE=cuda, the native allocator's cases each in a
  # fresh process).
  export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONPATH=$PWD/python
  mkdir -p "$out/logs/snapshots"
  GPUMEM_SNAPSHOT_HTML_DIR=$out/logs/snapshots python3 -m pytest -q -p no:cacheprovider python/tests \
    >"$out/logs/pytest.txt" 2>&1
  note "pytest on the GPU: rc=$? | $(tail -1 "$out/logs/pytest.txt")"
  cp "$out/logs/snapshots/snapshot-vpool.html" "$out/" 2>/dev/null
fi

if want torchbench && [[ -d python ]]; then
  # Training side by side with PyTorch's allocator, each in a fresh process.
  export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONPATH=$PWD/python
  python3 python/bench/torch_allocators.py speed --configs "${SPEED_CONFIGS:-torch,native:pool,native:vpool,pluggable:pool,mempool:vpool}" --out "$out/torch.jsonl" >"$out/logs/torch-speed.txt" 2>&1
  python3 python/bench/torch_allocators.py batch --configs "${BATCH_CONFIGS:-torch,native:pool,native:vpool,mempool:vpool}" \
    --out "$out/torch.jsonl" >"$out/logs/torch-batch.txt" 2>&1
  python3 - "$out/torch.jsonl" >"$out/logs/torch-summary.txt" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if "error" in r:
        print(f"torch {r['bench']} {r['config']} {r.get('model', '')}: ERROR rc={r['rc']} {r['error'][-200:]!r}")
    elif r["bench"] == "speed":
        print(f"torch speed {r['model']} {r['config']}: {r['s_per_iter'] * 1000:.1f} ms/iter, peak reserved {r['peak_reserved'] / 2**30:.2f} GiB")
    else:
        print(f"torch batch {r['config']} ({r['free_gib']} GiB free): largest batch {r['largest_batch']}, {r['ooms']} OOMs caught")
PY
  while read -r l; do note "$l"; done <"$out/logs/torch-summary.txt"
fi

if want steady; then
  # Two processes per trace of the steady state (five untimed replays first).
  for i in 1 2; do
    for tr in traces/*.csv; do
      bin/gpumem --device "$dev" replay "$tr" --alloc async,pool,caching,vpool --repeats 9 --warm-passes 5 --json >>"$out/replay-steady.jsonl" 2>>"$out/logs/replay.err"
    done
  done
  python3 - "$out/replay-steady.jsonl" >"$out/logs/steady.txt" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print(f"steady {r['alloc']} {r['params'].split()[0]} ns/op {r['ns_per_op']:.1f} res/live {r['reserved_over_live']:.3f}")
PY
  while read -r l; do note "$l"; done <"$out/logs/steady.txt"
fi

if want vpool && [[ -x bin/vpool_data ]]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 bin/vpool_data >"$out/logs/vpool-memcheck.txt" 2>&1
  note "vpool_data under memcheck: rc=$? | $(grep -E 'ERROR SUMMARY' "$out/logs/vpool-memcheck.txt" | tail -1) | $(grep -E '^checked' "$out/logs/vpool-memcheck.txt" | tail -1)"
  # The steady state of a repeating workload: five untimed replays first.
  for tr in traces/*.csv; do
    bin/gpumem --device "$dev" replay "$tr" --alloc async,pool,caching,vpool --repeats 3 --warm-passes 5 --json >>"$out/replay-steady.jsonl" 2>>"$out/logs/replay.err"
  done
  note "replay steady (5 warm passes): lines=$(wc -l <"$out/replay-steady.jsonl")"
  # The steady state differs from pool to pool (each repeat builds a fresh
  # one): eight more processes of 15 repeats each.
  for i in 1 2 3 4 5 6 7 8; do
    for tr in traces/*.csv; do
      bin/gpumem --device "$dev" replay "$tr" --alloc pool,vpool --repeats 15 --warm-passes 5 --json >>"$out/replay-steady-procs.jsonl" 2>>"$out/logs/replay.err"
    done
  done
  python3 - "$out" >"$out/logs/vpool-summary.txt" <<'PY'
import json, sys
for f in ("replay-cold", "replay-warm", "replay-steady"):
    try:
        rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{f}.jsonl")]
    except OSError:
        continue
    for r in rows:
        if r["alloc"] == "vpool":
            print(f"{f} vpool {r['params'].split()[0]} ns/op {r['ns_per_op']:.1f} res/live {r['reserved_over_live']:.3f}")
try:
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/replay-steady-procs.jsonl")]
except OSError:
    rows = []
by = {}
for r in rows:
    by.setdefault((r["alloc"], r["params"].split()[0]), []).append(r["ns_per_op"])
for (a, t), v in sorted(by.items()):
    v.sort()
    print(f"replay-steady {len(v)} processes {a} {t} ns/op min {v[0]:.1f} median {v[len(v) // 2]:.1f} max {v[-1]:.1f} | {' '.join(f'{x:.0f}' for x in v)}")
PY
  while read -r l; do note "$l"; done <"$out/logs/vpool-summary.txt"
fi

tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
echo
echo "===== summary ($date) ====="
printf '%s\n' "${summary[@]}"
