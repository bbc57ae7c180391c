#!/usr/bin/env bash
# Run 112 (nvidia-h200, one GPU): the confirming runs on the final tree of
# the 2026-11-28 stops, in two device calls that share the machine.
#   PART=a: PyTorch's TestCuda under PyTorch's allocator, gpumem pool and
#           gpumem vpool (up to 8 tests per process, failures again alone);
#           beside it, compute-sanitizer memcheck on graphs that reuse memory
#           across captures.
#   PART=b: the whole Rust suite against the driver; then TestCudaMallocAsync,
#           TestBlockStateAbsorption and TestMemPool under the three
#           allocators; then the native allocator built with no CUDA toolkit
#           (the NVIDIA runtime wheel's headers) and a short training step on it.
#   PART=c: the native allocator with no CUDA toolkit again (the toolkit now
#           hidden for real), then real_jobs.py on the two jobs where the
#           default was least lean (lm, gnn), 8 steady steps, rounds rotated
#           until the deadline.
# Usage, from the repository root with gpu-bundle.tar.xz carried:
#   tar -xJf gpu-bundle.tar.xz && PART=a OUT=$OUT bash bench/results/2026-11-29-h200-run112-confirm/session-112.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd gpu-bundle
O=${OUT:-/tmp/out}; mkdir -p "$O/logs"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export PYTHONPYCACHEPREFIX=/tmp/pycache
t0=$(date +%s)
part=${PART:-a}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [[ $part == a ]]; then
  PYTHONPATH=$PWD/python python3 -c 'import gpumem.torch as g; g._build_native()' > "$O/logs/build.log" 2>&1
  echo "native build rc=$? ($(( $(date +%s) - t0 )) s)"
  (
    for r in pool vpool; do
      PYTHONPATH=$PWD/python RESOURCE=$r timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 python/examples/graph_recapture_check.py > "$O/logs/memcheck-$r.log" 2>&1
      echo "memcheck $r rc=$? | $(grep -E 'ERROR SUMMARY' "$O/logs/memcheck-$r.log" | tail -1) | $(grep -E 'graph_recapture_check' "$O/logs/memcheck-$r.log" | tail -1)" >> "$O/logs/memcheck.log"
    done
  ) &
  JOBS=${JOBS:-14} ./torch-conformance.sh "$O/conf" --classes TestCuda --deadline ${DEADLINE:-300} \
    --alone-time ${ALONE:-190} --timeout 150 --batch 8 > "$O/logs/conformance.log" 2>&1
  wait
  echo "=== memcheck"; cat "$O/logs/memcheck.log"
elif [[ $part == c ]]; then
  echo "=== native allocator without a CUDA toolkit"
  PYTHONPATH=$PWD/python timeout 150 bash "$here/no-toolkit.sh" > "$O/logs/no-toolkit.log" 2>&1
  echo "rc=$? ($(( $(date +%s) - t0 )) s)"; tail -6 "$O/logs/no-toolkit.log"
  echo "=== real jobs"
  PYTHONPATH=$PWD/python timeout $(( ${BUDGET:-560} - ($(date +%s) - t0) )) python3 python/bench/real_jobs.py run \
    --jobs lm,gnn --configs torch,torch+expandable_segments:True,native:pool,native:vpool --steps 8 --rounds 3 \
    --timeout 120 --deadline $(( ${BUDGET:-560} - 150 - ($(date +%s) - t0) )) --out "$O/real-jobs.jsonl" > "$O/logs/real-jobs.log" 2>&1
  echo "rc=$? ($(( $(date +%s) - t0 )) s)"; tail -14 "$O/logs/real-jobs.log"
  cd "$O" && tar -czf run112c.tgz logs && rm -rf logs
  exit 0
else
  TEST_TIMEOUT=120 timeout 200 ./run-tests.sh "$O/logs/rust" > "$O/logs/rust.log" 2>&1
  echo "=== rust suite ($(( $(date +%s) - t0 )) s)"; grep -v "rc=0" "$O/logs/rust.log" | tail -8
  JOBS=${JOBS:-14} ./torch-conformance.sh "$O/conf" --classes TestCudaMallocAsync,TestBlockStateAbsorption,TestMemPool \
    --deadline ${DEADLINE:-120} --alone-time ${ALONE:-120} --timeout 150 --batch 8 > "$O/logs/conformance.log" 2>&1
  echo "=== native allocator without a CUDA toolkit ($(( $(date +%s) - t0 )) s)"
  PYTHONPATH=$PWD/python timeout 150 bash "$here/no-toolkit.sh" > "$O/logs/no-toolkit.log" 2>&1
  echo "rc=$?"; tail -6 "$O/logs/no-toolkit.log"
fi
echo "=== conformance ($(( $(date +%s) - t0 )) s)"; tail -40 "$O/logs/conformance.log"
cp "$O/conf/summary.txt" "$O/conformance-summary-$part.txt" 2>/dev/null
cp "$O/conf/results.jsonl" "$O/conformance-$part.jsonl" 2>/dev/null
cd "$O" && tar -czf "run112$part.tgz" logs conf && rm -rf logs conf
