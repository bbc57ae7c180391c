#!/usr/bin/env bash
# Runs 104-105 (nvidia-h200-x2): PyTorch's allocator tests, all four classes,
# each test in a process forked from a server (python/conformance/run.py),
# under torch, gpumem pool and vpool on both GPUs; before them, why
# vpool+nccl_ready=true failed on rank 1 (SDPA on GPU 1 alone, then a
# short torchrun DDP job with cuDNN's error log).
# Usage, from the repository root with gpu-bundle.tar.xz carried:
#   tar -xJf gpu-bundle.tar.xz && bash bench/results/2026-11-28-h200x2-run104-conformance/session-104.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd gpu-bundle
O=${OUT:-/tmp/out}; mkdir -p "$O/logs"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPYCACHEPREFIX=/tmp/pycache
t0=$(date +%s)
PYTHONPATH=$PWD/python python3 -c 'import gpumem.torch as g; g._build_native()' > "$O/logs/build.log" 2>&1
echo "native build rc=$? ($(( $(date +%s) - t0 )) s)"
(
  export PYTHONPATH=$PWD/python CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr
  for d in 1 0; do DEV=$d timeout 60 python3 "$here/sdpa_device.py" vpool+nccl_ready=true; done
  CUDNN_LOGLEVEL_DBG=2 CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr timeout 100 torchrun --nproc-per-node 2 python/bench/torchrun_train.py worker --config native:vpool+nccl_ready=true \
    --steps 3 --warmup 1 --batch 8 2>&1 | grep -v "^\s*$" | tail -60
  echo "ddp nccl_ready rc=${PIPESTATUS[0]}"
) > "$O/logs/nccl-ready-diag.log" 2>&1
echo "nccl_ready diagnosis done ($(( $(date +%s) - t0 )) s)"
JOBS=${JOBS:-28} ./torch-conformance.sh "$O/conf" --deadline ${DEADLINE:-300} --alone-time 90 > "$O/logs/conformance.log" 2>&1
echo "=== nccl_ready diagnosis"; grep -E "^dev |rc=|^ptr" "$O/logs/nccl-ready-diag.log" | cut -c1-300
grep -iE "E! |ERROR|status|not supported|alignment|CUDNN_STATUS" "$O/logs/nccl-ready-diag.log" | grep -v "^\[rank.\]:  " | cut -c1-300 | head -30
echo "=== conformance ($(( $(date +%s) - t0 )) s)"; tail -75 "$O/logs/conformance.log"
cp "$O/conf/summary.txt" "$O/conformance-summary.txt" 2>/dev/null
cp "$O/conf/results.jsonl" "$O/conformance.jsonl" 2>/dev/null
cd "$O" && tar -czf run${RUN:-104}.tgz logs conf && rm -rf logs conf
