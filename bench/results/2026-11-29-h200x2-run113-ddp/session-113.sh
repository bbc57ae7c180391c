#!/usr/bin/env bash
# Run 113 (nvidia-h200-x2), two calls in one lease:
#   PART=a: the Rust suite with both GPUs visible, IPC both ways and NCCL
#           register_mem_pool (multi-gpu.sh rust,ipc,nccl), on the build with
#           the stream-handle and Driver changes; the native allocator built
#           with no CUDA toolkit; then DDP (GPT-2 small, 2 ranks) under all
#           five configurations in rotated rounds until the deadline.
#   PART=b: more DDP rounds in the same lease (its rounds rotate the order
#           as part a's did); the two parts' rounds are pooled in the table.
# Usage, from the repository root with gpu-bundle.tar.xz carried:
#   tar -xJf gpu-bundle.tar.xz && PART=a OUT=$OUT bash bench/results/2026-11-29-h200x2-run113-ddp/session-113.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd gpu-bundle
O=${OUT:-/tmp/out}; mkdir -p "$O/logs"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPYCACHEPREFIX=/tmp/pycache
t0=$(date +%s)
part=${PART:-a}
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
if [[ $part == a ]]; then
  ./multi-gpu.sh "$O/multi" rust,ipc,nccl > "$O/logs/multi.log" 2>&1
  echo "=== multi-gpu rc=$? ($(( $(date +%s) - t0 )) s)"; tail -12 "$O/multi/summary.txt" 2>/dev/null || tail -12 "$O/logs/multi.log"
  echo "=== native allocator without a CUDA toolkit"
  PYTHONPATH=$PWD/python timeout 120 bash "$here/../2026-11-29-h200-run112-confirm/no-toolkit.sh" > "$O/logs/no-toolkit.log" 2>&1
  echo "rc=$? ($(( $(date +%s) - t0 )) s)"; tail -5 "$O/logs/no-toolkit.log"
fi
configs=torch,torch+expandable_segments:True,native:pool,native:vpool,native:vpool+nccl_ready=true
left=$(( ${BUDGET:-570} - ($(date +%s) - t0) ))
PYTHONPATH=$PWD/python timeout $left python3 python/bench/torchrun_train.py compare --parallel ddp --model gpt2-small --nproc 2 \
  --configs "$configs" --rounds 8 --deadline $(( left - 140 )) --timeout 120 --steps 30 --batch 8 \
  --out "$O/ddp-run113$part.jsonl" > "$O/logs/ddp.log" 2>&1
echo "=== ddp rc=$? ($(( $(date +%s) - t0 )) s)"; sed -n '/^ddp /,$p' "$O/logs/ddp.log"
cd "$O" && tar -czf "run113$part.tgz" logs && rm -rf logs
