#!/usr/bin/env bash
# Run 110 (nvidia-h200-x2): the memory-history tests of PyTorch's file
# again under all three allocators (test_memory_plots_free_stack failed
# under gpumem in run 109), the checkpoint test that failed on real GPUs,
# the NCCL-ready pool's tests on two GPUs, then DDP in rotated rounds with
# vpool,nccl_ready=true beside the others (kept blocks, this build).
# Usage, from the repository root with gpu-bundle.tar.xz carried:
#   tar -xJf gpu-bundle.tar.xz && OUT=$OUT bash bench/results/2026-11-28-h200x2-run110-nccl-kept/session-110.sh
set -u
cd gpu-bundle
O=${OUT:-/tmp/out}; mkdir -p "$O/logs"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPYCACHEPREFIX=/tmp/pycache
t0=$(date +%s)
PYTHONPATH=$PWD/python python3 -c 'import gpumem.torch as g; g._build_native()' > "$O/logs/build.log" 2>&1
echo "native build rc=$? ($(( $(date +%s) - t0 )) s)"
for t in tests/*; do
  GPUMEM_DEVICE=cuda $t --test-threads=1 > "$O/logs/rust-$(basename $t).log" 2>&1
  echo "rust $(basename $t): $(grep -E '^test result' "$O/logs/rust-$(basename $t).log" | tail -1)"
done
JOBS=12 ./torch-conformance.sh "$O/conf" -k memory --deadline 120 --alone-time 60 --timeout 120 --batch 4 \
  > "$O/logs/conformance.log" 2>&1
echo "=== conformance, tests with 'memory' in their name ($(( $(date +%s) - t0 )) s)"; sed -n '/^PyTorch/,$p' "$O/logs/conformance.log"
left=$(( 560 - ($(date +%s) - t0) ))
export PYTHONPATH=$PWD/python
timeout $left python3 python/bench/torchrun_train.py compare --parallel ddp --model gpt2-small --nproc 2 \
  --configs torch,torch+expandable_segments:True,native:pool,native:vpool,native:vpool+nccl_ready=true \
  --rounds 8 --deadline $(( left - 110 )) --timeout 120 --steps 30 --batch 8 --out "$O/ddp-run110.jsonl" > "$O/logs/ddp.log" 2>&1
echo "=== ddp rc=$? ($(( $(date +%s) - t0 )) s)"; sed -n '/^ddp /,$p' "$O/logs/ddp.log"
cp "$O/conf/summary.txt" "$O/conformance-summary.txt" 2>/dev/null
cp "$O/conf/results.jsonl" "$O/conformance.jsonl" 2>/dev/null
cd "$O" && tar -czf run110.tgz logs conf && rm -rf logs conf
