#!/usr/bin/env bash
# Run 67 (issue 19): pytest's MemPool IPC tests on the H100 (mempool() takes regions by default).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 400 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_native.py -k "mempool or ipc" > "$O/pytest.log" 2>&1
echo "pytest rc=$?"
grep -E "passed|failed|FAILED|Error" "$O/pytest.log" | tail -8
