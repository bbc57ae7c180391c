#!/usr/bin/env bash
# Everything gpumem shows on two or more GPUs of one host, in one command,
# run from inside gpu-bundle on the GPU machine (scripts/gpu-bundle.sh
# builds it): the Rust suite with every GPU visible (the two-device tests
# take GPUs 0 and 1), IPC between two GPUs both ways, a gpumem MemPool
# registered with NCCL, and torchrun DDP and FSDP2 training under PyTorch's
# allocator and gpumem side by side. Writes the results (JSON lines) and
# summary.txt under OUT_DIR (default ./out), the logs packed in logs.tgz, and
# prints the summary last.
#
# Usage: gpu-bundle/multi-gpu.sh [OUT_DIR] [PARTS]
#   PARTS: comma list of rust,ipc,nccl,ddp,fsdp (default: all)
#   ROUNDS (default 3): rounds of each torchrun comparison; DEADLINE (default
#   420): seconds after which a comparison starts no new round.
# NVLink multicast stays off in every process, children included.
set -uo pipefail
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${1:-out}
parts=${2:-rust,ipc,nccl,ddp,fsdp}
mkdir -p "$out"
res=$out
out=$out/logs
mkdir -p "$out"
want() { [[ ",$parts," == *",$1,"* ]]; }
summary=()
note() { summary+=("$*"); echo "== $*"; }
export GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
# The native allocator is built once (PyTorch's extension builder), before
# the ranks of the first job would race to build it.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/torch_extensions}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv >"$out/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >>"$out/nvidia-smi.txt" 2>&1
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
note "GPUs: $ngpu ($(sed -n 2p "$out/nvidia-smi.txt"))"
python3 -c 'import gpumem.torch as g; g._build_native()' >"$out/native-build.log" 2>&1
note "native allocator built: rc=$?"

if want rust; then
  GPUMEM_DEVICE=cuda ./run-tests.sh "$out/rust" >"$out/rust.txt" 2>&1
  note "rust suite, $ngpu GPUs: $(tail -1 "$out/rust.txt")"
  for t in multi_device device_buffer peer_access nccl_ready; do
    GPUMEM_DEVICE=cuda tests/$t-* --test-threads=1 --nocapture >"$out/rust-$t-nocapture.log" 2>&1
    note "  $t: $(grep -E '^test result' "$out/rust-$t-nocapture.log" | tail -1)"
  done
fi

if want ipc; then
  # A pool on one GPU exported to a process on the other, both ways: the
  # child reads the parent's bytes and writes its own, the parent checks them.
  GPUMEM_DEVICE=cuda GPUMEM_CUDA_DEVICE=0 bin/ipc_pool --child-device 1 >"$out/ipc-0to1.txt" 2>&1
  note "ipc GPU 0 -> GPU 1: rc=$? | $(grep -h 'bytes match\|wrote' "$out/ipc-0to1.txt" | paste -sd';')"
  GPUMEM_DEVICE=cuda GPUMEM_CUDA_DEVICE=1 bin/ipc_pool --child-device 0 >"$out/ipc-1to0.txt" 2>&1
  note "ipc GPU 1 -> GPU 0: rc=$? | $(grep -h 'bytes match\|wrote' "$out/ipc-1to0.txt" | paste -sd';')"
fi

if want nccl; then
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG timeout 300 python3 -m torch.distributed.run --standalone \
    --nproc-per-node "$ngpu" python/bench/nccl_register.py --mib 256 --out "$res/nccl_register.jsonl" \
    >"$out/nccl_register.log" 2>&1
  rc=$?
  note "nccl register_mem_pool: rc=$rc | $(grep -h '^nccl_register:' "$out/nccl_register.log")"
  note "  NCCL's log: $(grep -c 'IPC register buffer' "$out/nccl_register.log") 'IPC register buffer', $(grep -c 'IPC reuse buffer' "$out/nccl_register.log") 'IPC reuse buffer', $(grep -ci 'register comm' "$out/nccl_register.log") 'register comm' lines; NCCL $(grep -ho 'NCCL version [0-9.+a-z]*' "$out/nccl_register.log" | head -1)"
fi

if want ddp; then
  timeout 590 python3 python/bench/torchrun_train.py compare --parallel ddp --model gpt2-small --nproc "$ngpu" \
    --rounds "${ROUNDS:-3}" --deadline "${DEADLINE:-420}" --timeout 150 --steps 30 --batch 8 --out "$res/ddp.jsonl" >"$out/ddp.log" 2>&1
  note "ddp: rc=$?"
  while read -r l; do note "  $l"; done < <(sed -n '/^ddp /,$p' "$out/ddp.log")
fi

if want fsdp; then
  timeout 590 python3 python/bench/torchrun_train.py compare --parallel fsdp2 --model gpt-1b --nproc "$ngpu" \
    --rounds "${ROUNDS:-3}" --deadline "${DEADLINE:-420}" --timeout 200 --steps 15 --warmup 5 --batch 4 --out "$res/fsdp.jsonl" >"$out/fsdp.log" 2>&1
  note "fsdp2: rc=$?"
  while read -r l; do note "  $l"; done < <(sed -n '/^fsdp2 /,$p' "$out/fsdp.log")
fi

echo
echo "===== summary ($(date -u +%Y-%m-%d)) ====="
printf '%s\n' "${summary[@]}" | tee "$res/summary.txt"
tar -czf "$res/logs.tgz" -C "$res" logs && rm -rf "$out"
