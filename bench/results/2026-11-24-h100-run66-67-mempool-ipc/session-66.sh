#!/usr/bin/env bash
# Run 66 (issue 19): CUDA IPC of a tensor in a gpumem MemPool (PyTorch's allocator in
# charge), with expandable heaps (the default) and without.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
for e in false true; do
  timeout 120 python3 mempool_ipc_probe.py $e > "$O/probe-$e.log" 2>&1; echo "expandable=$e rc=$?"
  grep RESULT "$O/probe-$e.log" || tail -5 "$O/probe-$e.log"
done
