#!/usr/bin/env bash
# Run 63 (issue 21): torchrun DDP of GPT-2 small on two H200s, 6 rounds (each round
# starts with the next configuration), gpumem on both ranks beside PyTorch's allocator.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
timeout 570 python3 python/bench/ddp_gpt2.py compare --nproc 2 --configs torch,native:pool,native:vpool \
   --rounds 6 --steps 30 --out "$O/ddp-6-rounds.jsonl" > "$O/ddp-6-rounds.log" 2>&1; echo "ddp rc=$? in $(( $(date +%s) - t0 ))s"
tail -8 "$O/ddp-6-rounds.log"
