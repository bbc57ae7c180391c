#!/usr/bin/env bash
# One device call of a GPU session, run from inside gpu-bundle on the GPU
# machine: one round of the real-jobs benchmark (python/bench/real_jobs.py:
# the six jobs under PyTorch's default, expandable_segments, cudaMallocAsync,
# gpumem pool and gpumem vpool, one process each, rotated by the round),
# then the tasks named, in order, each while time is left:
#   conformance  PyTorch's allocator tests that touch the cache, memory and
#                graphs (test_cuda.py) under gpumem's default (CONF_CONFIGS),
#                started for CONF_DEADLINE seconds (default 180); CONF_K
#                picks other tests (run.py's -k), CONF_BATCH=1 runs each
#                in its own process
#   wheel        the Python package installed from its wheel (pkg/) and
#                used as a user would: no checkout, no GPUMEM_LIB
#   view         `gpumem view` pages of a real job (view-real-job.sh)
#   vpool-logs   vpool's allocation logs of gnn and vision (to replay here)
#   batch        the largest GPT-2 medium batch under a memory cap (FREE_GIB)
#   replay       `iterations` at vary 1 through the C ABI replay
# ROUND `-` runs no real jobs. Three calls with rounds 0, 1 and 2 in one
# lease make the table:
#   python3 python/bench/real_jobs.py table OUT*/real-jobs.raw.jsonl --configs ...
# Everything a call writes is packed into OUT/call.tgz beside the raw
# results, so at most 3 files come back; the work stops in time to pack
# (BUDGET seconds in all, default 560). On an H200 a round of the five
# configurations takes about 450 s: a round with tasks beside it, or under
# a smaller BUDGET, loses its last configurations to the deadline (run
# 115's round 0 lost vpool at BUDGET=450).
#
# CONFIGS replaces the configurations (real_jobs.py's names, such as
# native:pool+recycle=true); the first is the baseline.
#
# Usage: gpu-bundle/real-jobs-session.sh OUT ROUND|- [TASK...]
set -uo pipefail
cd "$(dirname "$0")"
out=$(mkdir -p "$1" && cd "$1" && pwd)
round=${2:?usage: real-jobs-session.sh OUT ROUND|- [TASK...]}
shift 2
budget=${BUDGET:-560}
t0=$(date +%s)
left() { echo $(( budget - 20 - ($(date +%s) - t0) )); }
el() { echo "$(( $(date +%s) - t0 )) s"; }
mkdir -p "$out/work"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=$PWD/torch_extensions PYTHONPYCACHEPREFIX=/tmp/pycache
configs=${CONFIGS:-torch,torch+expandable_segments:True,torch+backend:cudaMallocAsync,native:pool,native:vpool}
pack() { tar -czf "$out/call.tgz" -C "$out" work && rm -rf "$out/work"; }
trap pack EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/work/gpu.txt"

# Seconds the tasks after the real jobs keep for themselves.
keep=0
for task in "$@"; do
  case $task in
    conformance) keep=$(( keep + 260 )) ;; view) keep=$(( keep + 150 )) ;; batch) keep=$(( keep + 120 )) ;;
    *) keep=$(( keep + 60 )) ;;
  esac
done

if [[ $round != - ]]; then
  timeout $(( $(left) - keep )) python3 python/bench/real_jobs.py run --first-round "$round" --rounds 1 \
    --steps 12 --timeout 150 --deadline $(( $(left) - keep - 75 )) --configs "$configs" \
    --out "$out/work/real-jobs.jsonl" --raw "$out/real-jobs.raw.jsonl" > "$out/work/real-jobs.log" 2>&1
  echo "=== real jobs round $round: rc=$? ($(el))"
  grep -E 'FAILED|s/step' "$out/work/real-jobs.log" | tail -8
fi

conformance() {
  # The tests whose names say cache, memory or graph, and the allocator's
  # own classes: what a change to the pools' trim, release or graph memory
  # can break. Compare with PyTorch's allocator's results of earlier runs.
  local sel=${CONF_K:-'memory|cache|graph|TestMemPool::|TestBlockStateAbsorption::|TestCudaMallocAsync::'}
  local deadline=${CONF_DEADLINE:-180}
  (( deadline < $(left) - 120 )) || deadline=$(( $(left) - 120 ))
  CONFIGS=${CONF_CONFIGS:-native:pool} JOBS=14 timeout "$(left)" ./torch-conformance.sh "$out/work/conformance" \
    --classes TestCuda,TestMemPool,TestBlockStateAbsorption,TestCudaMallocAsync -k "$sel" \
    --deadline "$deadline" --alone-time 50 --timeout 120 --batch "${CONF_BATCH:-8}" > "$out/work/conformance.log" 2>&1
  echo "=== conformance rc=$? ($(el))"; tail -12 "$out/work/conformance.log"
}

wheel() {
  compgen -G "pkg/*.whl" >/dev/null || { echo "=== wheel: no pkg/*.whl in the bundle"; return; }
  python3 -m pip install -q --no-index --no-deps --target /tmp/wheelsite pkg/*.whl > "$out/work/wheel.log" 2>&1
  env -u GPUMEM_LIB PYTHONPATH=/tmp/wheelsite TORCH_EXTENSIONS_DIR=/tmp/wheel-ext timeout 150 python3 - \
    >> "$out/work/wheel.log" 2>&1 <<'PY'
import gpumem, gpumem.torch as g, torch
print("package:", gpumem.__file__, "| library:", gpumem.library_path())
print("enable:", g.enable())
m = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.AdamW(m.parameters())
for _ in range(5):
    loss = m(torch.randn(64, 1024, device="cuda")).square().mean()
    loss.backward(); opt.step(); opt.zero_grad()
torch.cuda.synchronize()
print(f"mode={g.mode()} loss={loss.item():.4f} allocated={torch.cuda.memory_allocated()}")
assert g.mode() == "native" and torch.cuda.memory_allocated() == g.allocated_bytes() > 0
print("wheel: ok")
PY
  echo "=== wheel rc=$? ($(el))"; tail -3 "$out/work/wheel.log"
}

view() {
  timeout "$(left)" ./view-real-job.sh "$out/work/view" 3 > "$out/work/view.log" 2>&1
  echo "=== view rc=$? ($(el))"; tail -8 "$out/work/view.log"
}

vpool-logs() {
  # `vpool`'s allocation logs of gnn and vision, whose steps it ran slower
  # than PyTorch's allocator; replayed here on the simulator they count its
  # mappings per step.
  for job in gnn vision; do
    (( $(left) > 40 )) || break
    timeout "$(( $(left) - 5 ))" python3 python/bench/real_jobs.py child --job "$job" --steps 8 \
      --config "native:vpool+log=$out/work/$job-vpool.rmm.csv" > "$out/work/$job-vpool-log.txt" 2>&1
    echo "=== $job vpool log rc=$? ($(el))"; gzip -f "$out/work/$job-vpool.rmm.csv"
  done
}

batch() {
  timeout "$(left)" python3 python/bench/torch_allocators.py batch --free-gib "${FREE_GIB:-24}" \
    --configs "$configs" --out "$out/work/batch.jsonl" > "$out/work/batch.log" 2>&1
  echo "=== batch rc=$? ($(el))"
  python3 - "$out/work/batch.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["config"], "largest batch", r.get("largest_batch"), "OOMs", r.get("ooms"), (r.get("error") or "")[-160:])
PY
}

replay() {
  bin/iterations_trace --vary 1 --passes 6 --seed 42 > /tmp/iter_1.rmm.csv
  timeout "$(left)" python3 python/bench/torch_trace_replay.py /tmp/iter_1.rmm.csv --split-passes \
    --repeats 2 --allocators torch,pool,vpool --out "$out/work/capi-replay.jsonl" > "$out/work/replay.log" 2>&1
  echo "=== replay rc=$? ($(el))"; tail -4 "$out/work/replay.log"
}

for task in "$@"; do
  case $task in
    conformance | wheel | view | vpool-logs | batch | replay)
      if (( $(left) > 30 )); then "$task"; else echo "=== $task: not run, no time left"; fi ;;
    *) echo "=== unknown task $task" ;;
  esac
done
echo "=== done ($(el))"
