#!/usr/bin/env bash
# Diagnostics: nccl_ready with cuDNN's SDPA, an FSDP2 log under vpool, NCCL
# registration with all-gather, and a conformance-runner smoke run.
set -u
cd "$(dirname "$0")/../gpu-bundle"
O=${OUT:-/tmp/out}; mkdir -p "$O/d"
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import gpumem.torch as g; g._build_native()' > "$O/d/build.log" 2>&1
for c in "vpool+nccl_ready=true" "vpool" "pool"; do
  timeout 120 python3 ../gpu-diag/sdpa_nccl_ready.py "$c" >> "$O/d/sdpa.txt" 2>&1
done
CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr \
  timeout 120 python3 ../gpu-diag/sdpa_nccl_ready.py "vpool+nccl_ready=true" > "$O/d/sdpa-cudnn-log.txt" 2>&1
CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 ../gpu-diag/sdpa_nccl_ready.py "vpool+nccl_ready=true" > "$O/d/sdpa-blocking.txt" 2>&1
cat "$O/d/sdpa.txt"
grep -i "error\|fail\|status" "$O/d/sdpa-cudnn-log.txt" | head -20
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
  python/bench/nccl_register.py --mib 256 --out "$O/d/nccl_register.jsonl" > "$O/d/nccl.log" 2>&1
echo "nccl rc=$? | $(grep -h '^nccl_register:' "$O/d/nccl.log") | IPC register lines: $(grep -c 'IPC register buffer' "$O/d/nccl.log") reuse: $(grep -c 'IPC reuse buffer' "$O/d/nccl.log")"
# An FSDP2 job's allocation log under vpool (each rank its own file), 2 rounds of vpool and pool timing.
timeout 250 python3 python/bench/torchrun_train.py compare --parallel fsdp2 --model gpt-1b --rounds 1 --steps 10 --warmup 3 --batch 4 \
  --configs "native:pool,native:vpool,native:vpool+log=$O/d/fsdp-vpool-{rank}.csv" --out "$O/d/fsdp.jsonl" > "$O/d/fsdp.log" 2>&1
echo "fsdp rc=$?"; sed -n '/^fsdp2 /,$p' "$O/d/fsdp.log"
ls -la $O/d/*.csv
CONFIGS=torch,native:pool,native:vpool timeout 200 ./torch-conformance.sh "$O/d/conf" -k TestBlockStateAbsorption --deadline 120 --alone-time 40 > "$O/d/conf.log" 2>&1
echo "conformance rc=$?"; tail -30 "$O/d/conf.log"
cd "$O" && tar -czf diag.tgz d && rm -rf d
