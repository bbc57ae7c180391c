#!/usr/bin/env bash
# Run 114 (nvidia-h200, one GPU), in device calls that share the machine.
#   PART=a: PyTorch's allocator tests that read gpumem's snapshots and
#           statistics (TestCuda's memory tests, TestMemPool,
#           TestBlockStateAbsorption, TestCudaMallocAsync) under gpumem pool
#           and vpool, after the C ABI's introspection moved into the
#           library; beside them the native allocator without a CUDA
#           toolkit, the wheel installed and used, and the real-job
#           recordings for `gpumem view`. Then the C ABI replay table.
#   PART=b: real_jobs.py, rounds FIRST.. (ROUNDS of them) until the deadline.
#   PART=c: largest GPT-2 medium batch under a memory cap, then real_jobs.py
#           rounds FIRST.. until the deadline.
# Usage, from the repository root with gpu-bundle.tar.xz carried:
#   tar -xJf gpu-bundle.tar.xz && PART=a OUT=$OUT bash bench/results/2026-11-29-h200-run114-real-jobs/session-114.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd gpu-bundle
O=${OUT:-/tmp/out}; mkdir -p "$O/logs"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export PYTHONPYCACHEPREFIX=/tmp/pycache
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 )) s"; }
budget=${BUDGET:-570}
part=${PART:-a}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
real_jobs() { # FIRST ROUNDS
  PYTHONPATH=$PWD/python timeout $(( budget - ($(date +%s) - t0) )) python3 python/bench/real_jobs.py run \
    --first-round "$1" --rounds "$2" --steps 8 --timeout 120 --deadline $(( budget - 90 - ($(date +%s) - t0) )) \
    --configs torch,torch+expandable_segments:True,torch+backend:cudaMallocAsync,native:pool,native:vpool \
    --out "$O/real-jobs-$part.jsonl" >> "$O/logs/real-jobs-$part.log" 2>&1
  echo "=== real jobs rounds $1.. rc=$? ($(el))"; grep -c ' s/step' "$O/logs/real-jobs-$part.log"; grep FAILED "$O/logs/real-jobs-$part.log" | head -5
}
if [[ $part == a ]]; then
  PYTHONPATH=$PWD/python python3 -c 'import gpumem.torch as g; g._build_native()' > "$O/logs/build.log" 2>&1
  echo "native build rc=$? ($(el))"
  (
    CONFIGS=native:pool,native:vpool JOBS=7 ./torch-conformance.sh "$O/conf-classes" \
      --classes TestMemPool,TestBlockStateAbsorption,TestCudaMallocAsync --deadline 200 --alone-time 80 \
      --timeout 150 --batch 8 > "$O/logs/conformance-classes.log" 2>&1 &
    sleep 20  # after the first one's pip install into /tmp/site
    CONFIGS=native:pool,native:vpool JOBS=7 ./torch-conformance.sh "$O/conf-memory" --classes TestCuda -k memory \
      --deadline 200 --alone-time 80 --timeout 150 --batch 8 > "$O/logs/conformance-memory.log" 2>&1 &
    wait
  ) &
  conf=$!
  (
    PYTHONPATH=$PWD/python IN_PROCESS=1 timeout 150 bash "$here/../2026-11-29-h200-run112-confirm/no-toolkit.sh" \
      > "$O/logs/no-toolkit.log" 2>&1
    echo "no-toolkit rc=$?" >> "$O/logs/no-toolkit.log"
    # The wheel, installed as a user would (no GPUMEM_LIB, no checkout),
    # its native allocator built and training.
    python3 -m pip install -q --no-index --no-deps --target /tmp/wheelsite pkg/*.whl > "$O/logs/wheel.log" 2>&1
    env -u GPUMEM_LIB PYTHONPATH=/tmp/wheelsite TORCH_EXTENSIONS_DIR=/tmp/wheel-ext timeout 150 python3 - >> "$O/logs/wheel.log" 2>&1 <<'PY'
import gpumem, gpumem.torch as g, torch
print("package:", gpumem.__file__, "| library:", gpumem.library_path())
print("enable:", g.enable())
m = torch.nn.Linear(1024, 1024).cuda(); opt = torch.optim.AdamW(m.parameters())
for _ in range(5):
    loss = m(torch.randn(64, 1024, device="cuda")).square().mean(); loss.backward(); opt.step(); opt.zero_grad()
torch.cuda.synchronize()
print(f"mode={g.mode()} loss={loss.item():.4f} allocated={torch.cuda.memory_allocated()} reserved={torch.cuda.memory_reserved()}")
assert g.mode() == "native" and torch.cuda.memory_allocated() == g.allocated_bytes() > 0
print("wheel: ok")
PY
    echo "wheel rc=$?" >> "$O/logs/wheel.log"
    timeout 300 ./view-real-job.sh "$O/view" 6 > "$O/logs/view.log" 2>&1
    echo "view rc=$?" >> "$O/logs/view.log"
  ) &
  side=$!
  wait $conf
  echo "=== conformance ($(el))"
  for f in classes memory; do tail -12 "$O/logs/conformance-$f.log"; done
  wait $side
  echo "=== no-toolkit"; tail -4 "$O/logs/no-toolkit.log"
  echo "=== wheel"; tail -4 "$O/logs/wheel.log"
  echo "=== view ($(el))"; cat "$O/logs/view.log"
  # The C ABI replay table: PyTorch's allocator and gpumem's C ABI in one
  # C++ loop, on the shared logs, the iterations workload and the widely
  # varying log, rotated processes.
  mkdir -p "$O/replay"
  for v in 0 0.3 1; do bin/iterations_trace --vary $v --passes 6 --seed 42 > "/tmp/iter_$v.rmm.csv"; done
  bin/capi_replay --wide 1 --write /tmp/wide_sizes.rmm.csv --passes 1 > "$O/logs/wide-sim.log" 2>&1
  rp() { PYTHONPATH=$PWD/python timeout $(( budget - ($(date +%s) - t0) )) python3 python/bench/torch_trace_replay.py \
    --repeats 3 --out "$O/replay/capi-replay.jsonl" "$@" >> "$O/logs/replay.log" 2>&1; echo "replay $* rc=$? ($(el))"; }
  rp traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv --passes 6 --allocators torch,pool,vpool
  rp /tmp/iter_0.rmm.csv /tmp/iter_0.3.rmm.csv /tmp/iter_1.rmm.csv --split-passes --allocators torch,pool,vpool
  rp /tmp/wide_sizes.rmm.csv --passes 6 --allocators torch,pool,vpool,caching
  echo "=== replay"; grep -v '^replay\|^trace' "$O/logs/replay.log" | tail -20
  cd "$O" && tar -czf run114a.tgz logs conf-classes conf-memory && rm -rf logs conf-classes conf-memory
  exit 0
elif [[ $part == d ]]; then
  # What part a lost to its time limit (the C ABI replay table, the
  # native allocator without a toolkit, the wheel), with a second round of
  # real jobs for PyTorch's default, pool and vpool between them.
  mkdir -p "$O/replay"
  for v in 0 0.3 1; do bin/iterations_trace --vary $v --passes 6 --seed 42 > "/tmp/iter_$v.rmm.csv"; done
  bin/capi_replay --wide 1 --write /tmp/wide_sizes.rmm.csv --passes 1 > "$O/logs/wide-sim.log" 2>&1
  rp() { PYTHONPATH=$PWD/python timeout 100 python3 python/bench/torch_trace_replay.py \
    --repeats 2 --out "$O/replay/capi-replay.jsonl" "$@" >> "$O/logs/replay.log" 2>&1; echo "replay $1 rc=$? ($(el))"; }
  rp traces/gpt2_train.rmm.csv traces/resnet50_train.rmm.csv --passes 6 --allocators torch,pool,vpool
  rp /tmp/iter_0.rmm.csv /tmp/iter_0.3.rmm.csv /tmp/iter_1.rmm.csv --split-passes --allocators torch,pool,vpool
  rp /tmp/wide_sizes.rmm.csv --passes 6 --allocators torch,pool,vpool,caching
  echo "=== replay"; grep -v '^replay' "$O/logs/replay.log" | tail -24
  PYTHONPATH=$PWD/python timeout $(( 480 - ($(date +%s) - t0) )) python3 python/bench/real_jobs.py run \
    --first-round 1 --rounds 1 --steps 8 --timeout 120 --configs torch,native:pool,native:vpool \
    --out "$O/real-jobs-d.jsonl" > "$O/logs/real-jobs-d.log" 2>&1
  echo "=== real jobs round 1 rc=$? ($(el))"; tail -22 "$O/logs/real-jobs-d.log"
  PYTHONPATH=$PWD/python IN_PROCESS=1 timeout $(( 585 - ($(date +%s) - t0) )) bash "$here/../2026-11-29-h200-run112-confirm/no-toolkit.sh" \
    > "$O/logs/no-toolkit.log" 2>&1
  echo "=== no-toolkit rc=$? ($(el))"; tail -4 "$O/logs/no-toolkit.log"
  cd "$O" && tar -czf run114d.tgz logs && rm -rf logs
  exit 0
elif [[ $part == b ]]; then
  real_jobs "${FIRST:-0}" "${ROUNDS:-3}"
else
  echo "=== largest batch under a cap"
  PYTHONPATH=$PWD/python timeout 240 python3 python/bench/torch_allocators.py batch --free-gib ${FREE_GIB:-24} \
    --configs torch,torch+expandable_segments:True,torch+backend:cudaMallocAsync,native:pool,native:vpool \
    --out "$O/batch.jsonl" > "$O/logs/batch.log" 2>&1
  echo "rc=$? ($(el))"
  python3 -c "
import json,sys
for l in open('$O/batch.jsonl'):
    r=json.loads(l); print(r['config'], 'largest batch', r.get('largest_batch'), 'ooms', r.get('ooms'), 'peak reserved', r.get('peak_reserved'), r.get('error','')[-200:])"
  real_jobs "${FIRST:-2}" "${ROUNDS:-1}"
fi
tail -40 "$O/logs/real-jobs-$part.log"
cd "$O" && tar -czf "run114$part.tgz" logs && rm -rf logs
