#!/usr/bin/env bash
# Run 109 (nvidia-h200-x2): all of PyTorch's allocator tests (TestCuda,
# TestCudaMallocAsync, TestBlockStateAbsorption, TestMemPool) under PyTorch's
# allocator, gpumem pool and gpumem vpool in one call, up to 8 tests per
# process (failures again alone), on both GPUs; beside them on GPU 1,
# torch.compile(mode="reduce-overhead") with changing shapes and memcheck on
# graphs that reuse memory across captures.
# Usage, from the repository root with gpu-bundle.tar.xz carried:
#   tar -xJf gpu-bundle.tar.xz && OUT=$OUT bash bench/results/2026-11-28-h200x2-run109-conformance/session-109.sh
set -u
cd gpu-bundle
O=${OUT:-/tmp/out}; mkdir -p "$O/logs"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPYCACHEPREFIX=/tmp/pycache
t0=$(date +%s)
PYTHONPATH=$PWD/python python3 -c 'import gpumem.torch as g; g._build_native()' > "$O/logs/build.log" 2>&1
echo "native build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -3 "$O/logs/build.log"
(
  export PYTHONPATH=$PWD/python CUDA_VISIBLE_DEVICES=1
  timeout 300 python3 python/bench/compile_shapes.py compare --configs torch,native:pool,native:vpool \
    --out "$O/compile_shapes.jsonl" > "$O/logs/compile.log" 2>&1
  echo "compile rc=$?" >> "$O/logs/compile.log"
  for r in pool vpool; do
    RESOURCE=$r timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 python/examples/graph_recapture_check.py \
      > "$O/logs/memcheck-$r.log" 2>&1
    echo "memcheck $r rc=$? | $(grep -E 'ERROR SUMMARY' "$O/logs/memcheck-$r.log" | tail -1) | $(grep -E 'graph_recapture_check' "$O/logs/memcheck-$r.log" | tail -1)" >> "$O/logs/compile.log"
  done
) &
JOBS=${JOBS:-28} ./torch-conformance.sh "$O/conf" --deadline ${DEADLINE:-380} --alone-time ${ALONE:-110} \
  --timeout 150 --batch ${BATCH:-8} > "$O/logs/conformance.log" 2>&1
wait
echo "=== compile and memcheck"; sed -n '/^compile_shapes:/,$p' "$O/logs/compile.log"; grep -E "^compile rc|^memcheck" "$O/logs/compile.log"
echo "=== conformance ($(( $(date +%s) - t0 )) s)"; tail -60 "$O/logs/conformance.log"
cp "$O/conf/summary.txt" "$O/conformance-summary.txt" 2>/dev/null
cp "$O/conf/results.jsonl" "$O/conformance.jsonl" 2>/dev/null
cd "$O" && tar -czf run109.tgz logs conf && rm -rf logs conf
