#!/usr/bin/env bash
# Run 106 (nvidia-h200-x2): the classes runs 104-105 did not reach
# (TestCudaMallocAsync, TestBlockStateAbsorption, TestMemPool) and the
# TestCuda tests that failed there, under torch, gpumem pool and vpool,
# each test in its own process on both GPUs; beside them, memcheck on
# graphs that reuse memory across captures (the hold path changed).
# Usage, from the repository root with gpu-bundle.tar.xz carried:
#   tar -xJf gpu-bundle.tar.xz && bash bench/results/2026-11-28-h200x2-run104-conformance/session-106.sh
set -u
cd gpu-bundle
O=${OUT:-/tmp/out}; mkdir -p "$O/logs"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPYCACHEPREFIX=/tmp/pycache
t0=$(date +%s)
PYTHONPATH=$PWD/python python3 -c 'import gpumem.torch as g; g._build_native()' > "$O/logs/build.log" 2>&1
echo "native build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -3 "$O/logs/build.log"
(
  export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$PWD/python RESOURCE=pool
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 python/examples/graph_recapture_check.py \
    > "$O/logs/memcheck-pool.log" 2>&1
  echo "memcheck pool rc=$? | $(grep -E 'ERROR SUMMARY' "$O/logs/memcheck-pool.log" | tail -1) | $(grep -E 'graph_recapture_check' "$O/logs/memcheck-pool.log" | tail -1)" > "$O/logs/memcheck.txt"
) &
T=TestCuda::
CLASSES="TestCudaMallocAsync,TestBlockStateAbsorption,TestMemPool,${T}test_graph_memory_stats_and_use_result_after_destroy_graph"
CLASSES+=",${T}test_memory_stats_of_multiple_generators_and_graphs,${T}test_pinned_memory_use_background_threads"
CLASSES+=",${T}test_pinned_memory_empty_cache,${T}test_memory_stats"
JOBS=${JOBS:-28} ./torch-conformance.sh "$O/conf" --classes "$CLASSES" --deadline ${DEADLINE:-270} --alone-time 70 \
  > "$O/logs/conformance.log" 2>&1
wait
echo "=== memcheck"; cat "$O/logs/memcheck.txt"
echo "=== conformance ($(( $(date +%s) - t0 )) s)"; tail -60 "$O/logs/conformance.log"
cp "$O/conf/summary.txt" "$O/conformance-summary.txt" 2>/dev/null
cp "$O/conf/results.jsonl" "$O/conformance.jsonl" 2>/dev/null
cd "$O" && tar -czf run106.tgz logs conf && rm -rf logs conf
