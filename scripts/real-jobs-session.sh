#!/usr/bin/env bash
# One device call of the real-jobs benchmark (python/bench/real_jobs.py), run
# from inside gpu-bundle on the GPU machine: round ROUND of the six jobs under
# PyTorch's default, expandable_segments, cudaMallocAsync, gpumem pool and
# gpumem vpool (one process each, rotated by the round), then one side task:
#   round 0: `gpumem view` pages of a real job (view-real-job.sh), then
#            vpool's allocation logs of gnn and vision where time allows;
#   round 1: the largest GPT-2 medium batch under a memory cap;
#   round 2: the wheel installed and used (pkg/, when the bundle carries
#            one), and `iterations` at vary 1 through the C ABI replay.
# Three calls, rounds 0, 1 and 2, in one lease make the table:
#   python3 python/bench/real_jobs.py table OUT*/real-jobs.raw.jsonl --configs ...
# Everything a call writes is packed into OUT/round-ROUND.tgz beside the raw
# results, so at most 3 files come back; the work stops in time to pack
# (BUDGET seconds in all, default 560: three calls and the machine's start
# fit in a session's 30 minutes).
#
# Usage: gpu-bundle/real-jobs-session.sh OUT ROUND
set -uo pipefail
cd "$(dirname "$0")"
out=$(mkdir -p "$1" && cd "$1" && pwd)
round=${2:?usage: real-jobs-session.sh OUT ROUND}
budget=${BUDGET:-560}
t0=$(date +%s)
left() { echo $(( budget - 20 - ($(date +%s) - t0) )); }
mkdir -p "$out/work"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=$PWD/torch_extensions PYTHONPYCACHEPREFIX=/tmp/pycache
configs=torch,torch+expandable_segments:True,torch+backend:cudaMallocAsync,native:pool,native:vpool
# Snapshots' pickles stay behind: the pages hold what they show.
pack() { tar -czf "$out/round-$round.tgz" --exclude='*.pickle' -C "$out" work && rm -rf "$out/work"; }
trap pack EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/work/gpu.txt"

side=110   # seconds kept for the side task
timeout $(( $(left) - side )) python3 python/bench/real_jobs.py run --first-round "$round" --rounds 1 \
  --steps 12 --timeout 150 --deadline $(( $(left) - side - 75 )) --configs "$configs" --out "$out/work/real-jobs.jsonl" \
  --raw "$out/real-jobs.raw.jsonl" > "$out/work/real-jobs.log" 2>&1
echo "=== real jobs round $round: rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E 'FAILED|s/step' "$out/work/real-jobs.log" | tail -8

case $round in
  0)
    timeout "$(left)" ./view-real-job.sh "$out/work/view" 3 > "$out/work/view.log" 2>&1
    echo "=== view rc=$?"; tail -8 "$out/work/view.log"
    # Where time allows: `vpool`'s allocation logs of gnn and vision, whose
    # steps it ran slower than PyTorch's allocator; replayed here on the
    # simulator they count its mappings per step.
    for job in gnn vision; do
      (( $(left) > 40 )) || break
      timeout "$(( $(left) - 5 ))" python3 python/bench/real_jobs.py child --job "$job" --steps 8 \
        --config "native:vpool+log=$out/work/$job-vpool.rmm.csv" > "$out/work/$job-vpool-log.txt" 2>&1
      echo "=== $job vpool log rc=$?"; gzip -f "$out/work/$job-vpool.rmm.csv"
    done
    ;;
  1)
    timeout "$(left)" python3 python/bench/torch_allocators.py batch --free-gib "${FREE_GIB:-24}" \
      --configs "$configs" --out "$out/work/batch.jsonl" > "$out/work/batch.log" 2>&1
    echo "=== batch rc=$?"
    python3 - "$out/work/batch.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["config"], "largest batch", r.get("largest_batch"), "OOMs", r.get("ooms"), (r.get("error") or "")[-160:])
PY
    ;;
  2)
    if compgen -G "pkg/*.whl" >/dev/null; then
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
      echo "=== wheel rc=$?"; tail -3 "$out/work/wheel.log"
    fi
    bin/iterations_trace --vary 1 --passes 6 --seed 42 > /tmp/iter_1.rmm.csv
    timeout "$(left)" python3 python/bench/torch_trace_replay.py /tmp/iter_1.rmm.csv --split-passes \
      --repeats 2 --allocators torch,pool,vpool --out "$out/work/capi-replay.jsonl" > "$out/work/replay.log" 2>&1
    echo "=== replay rc=$?"; tail -4 "$out/work/replay.log"
    ;;
esac
echo "=== done ($(( $(date +%s) - t0 )) s)"
