#!/usr/bin/env bash
# Run 107 (nvidia-h200-x2): why vpool+nccl_ready fails in DDP on rank 1,
# PyTorch's test_memory_plots step by step, then DDP rounds for the
# step-time table. From the repository root, after building the bundle:
#   tar -xJf gpu-bundle.tar.xz && OUT=$OUT bash bench/results/2026-11-28-h200x2-run107-diag/session-107.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd gpu-bundle
O=${OUT:-/tmp/out}; D=$O/d; mkdir -p "$D"
start=$(date +%s)
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=$PWD/torch_extensions
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import gpumem.torch as g; g._build_native()' > "$D/build.log" 2>&1; echo "build rc=$?"
for dev in 1 0; do
  DEV=$dev timeout 90 python3 "$here/gpt_device.py" "vpool+nccl_ready=true" >> "$D/gpt-device.txt" 2>&1
done
W="python/bench/torchrun_train.py worker --parallel ddp --model gpt2-small --steps 3 --warmup 1 --batch 8"
CUDA_VISIBLE_DEVICES=1 timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 1 $W \
  --config native:vpool+nccl_ready=true > "$D/ddp-1rank-gpu1.log" 2>&1
echo "1 rank on GPU 1 alone, nccl_ready: rc=$?" >> "$D/gpt-device.txt"
CUDNN_LOGERR_DBG=1 CUDNN_LOGWARN_DBG=1 CUDNN_LOGDEST_DBG=stderr CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr \
  timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 $W \
  --config native:vpool+nccl_ready=true > "$D/ddp-2rank-cudnnlog.log" 2>&1
echo "2 ranks, nccl_ready, cuDNN logs: rc=$?" >> "$D/gpt-device.txt"
for c in pool vpool torch; do timeout 90 python3 "$here/memory_plots.py" $c >> "$D/memory-plots.txt" 2>&1; done
echo "diagnostics: $(( $(date +%s) - start )) s"
left=$(( 560 - ($(date +%s) - start) ))
timeout $left python3 python/bench/torchrun_train.py compare --parallel ddp --model gpt2-small --nproc 2 \
  --configs torch,torch+expandable_segments:True,native:pool,native:vpool \
  --rounds 8 --deadline $(( left - 75 )) --timeout 120 --steps 30 --batch 8 --out "$O/ddp-run107.jsonl" > "$D/ddp.log" 2>&1
echo "ddp rc=$?"
grep -h "round\|error\|Error" "$D/ddp-1rank-gpu1.log" | tail -5
grep -hi "cudnn\|error\|fail\|status" "$D/ddp-2rank-cudnnlog.log" | grep -v "^\s*$" | tail -25 > "$O/cudnn-excerpt.txt"
cat "$D/gpt-device.txt" "$D/memory-plots.txt"
grep "round" "$D/ddp.log" | tail -40
sed -n '/^ddp /,$p' "$D/ddp.log"
cd "$O" && tar -czf diag.tgz d && rm -rf d
echo "total $(( $(date +%s) - start )) s"
