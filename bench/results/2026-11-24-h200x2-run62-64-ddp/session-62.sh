#!/usr/bin/env bash
# Run 62 (issue 21): two GPUs (nvidia-h200-x2): the Rust suite with both devices, the
# multi-device, peer-access and NCCL-ready tests' logs, the two-GPU IPC exchange, and
# torchrun DDP of GPT-2 small with gpumem on both ranks beside PyTorch's allocator.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > "$O/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >> "$O/nvidia-smi.txt" 2>&1
grep -c H200 "$O/nvidia-smi.txt" | sed 's/^/H200 lines: /' >> "$S"
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -8 >> "$S"
for t in multi_device peer_access nccl_ready device_buffer; do
  f=$(ls tests/${t}-* 2>/dev/null | head -1)
  [ -n "$f" ] && timeout 60 "$f" --nocapture --test-threads=1 > "$O/$t-nocapture.log" 2>&1
  echo "$t: rc=$? $(grep -E '^test result' "$O/$t-nocapture.log" | tail -1)" >> "$S"
  grep -h -i -E 'skipped|one device' "$O/$t-nocapture.log" | sort | uniq -c | head -3 >> "$S"
done
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
echo "== ipc ($(( $(date +%s) - t0 ))s)" >> "$S"
timeout 60 bin/ipc_pool > "$O/ipc_pool.txt" 2>&1; echo "ipc_pool (same device) rc=$? $(tail -1 $O/ipc_pool.txt)" >> "$S"
timeout 60 bin/ipc_pool --child-device 1 > "$O/ipc_pool_dev1.txt" 2>&1; echo "ipc_pool --child-device 1 rc=$? $(tail -1 $O/ipc_pool_dev1.txt)" >> "$S"
echo "== ddp ($(( $(date +%s) - t0 ))s)" >> "$S"
timeout $(( 560 - ($(date +%s) - t0) )) python3 python/bench/ddp_gpt2.py compare --nproc 2 --configs torch,native:pool,native:vpool \
   --rounds 2 --steps 30 --register --out "$O/ddp.jsonl" > "$O/ddp.log" 2>&1; echo "ddp rc=$?" >> "$S"
tail -12 "$O/ddp.log" >> "$S"
echo "== done in $(( $(date +%s) - t0 ))s" >> "$S"
cat "$S"
