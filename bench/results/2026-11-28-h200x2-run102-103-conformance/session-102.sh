#!/usr/bin/env bash
# Run 102: PyTorch's allocator tests under torch, gpumem pool and vpool
# (all four classes, each test in its own process, both GPUs), beside
# torch.compile with changing shapes and memcheck on graphs that reuse
# memory across captures.
set -u
cd "$(dirname "$0")/../gpu-bundle"
O=${OUT:-/tmp/out}; mkdir -p "$O/logs"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPYCACHEPREFIX=/tmp/pycache
t0=$(date +%s)
PYTHONPATH=$PWD/python python3 -c 'import gpumem.torch as g; g._build_native()' > "$O/logs/build.log" 2>&1
echo "native build rc=$? ($(( $(date +%s) - t0 )) s)"
JOBS=26 ./torch-conformance.sh "$O/conf" --deadline 390 --alone-time 70 > "$O/logs/conformance.log" 2>&1 &
cpid=$!
(
  export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$PWD/python
  timeout 330 python3 python/bench/compile_shapes.py compare --configs torch,native:pool,native:vpool \
    --out "$O/compile_shapes.jsonl" > "$O/logs/compile.log" 2>&1
  echo "compile rc=$?" >> "$O/logs/compile.log"
  for r in pool vpool; do
    RESOURCE=$r timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 python/examples/graph_recapture_check.py \
      > "$O/logs/memcheck-$r.log" 2>&1
    echo "memcheck $r rc=$? | $(grep -E 'ERROR SUMMARY' "$O/logs/memcheck-$r.log" | tail -1) | $(grep -E 'graph_recapture_check' "$O/logs/memcheck-$r.log" | tail -1)" >> "$O/logs/compile.log"
  done
) &
wait
echo "=== compile and memcheck"; sed -n '/^compile_shapes:/,$p' "$O/logs/compile.log"; grep -E "^compile rc|^memcheck" "$O/logs/compile.log"
echo "=== conformance ($(( $(date +%s) - t0 )) s)"; tail -60 "$O/logs/conformance.log"
cp "$O/conf/summary.txt" "$O/conformance-summary.txt" 2>/dev/null
cd "$O" && tar -czf run102.tgz logs conf && rm -rf logs conf
