#!/usr/bin/env bash
# Run 84, second part: the Python tests on the H100 (PyTorch 2.11, CuPy).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
timeout 560 python3 -m pytest -q -p no:cacheprovider python/tests > "$O/pytest.txt" 2>&1; echo "pytest rc=$? in $(( $(date +%s) - t0 ))s" >> "$O/pytest.txt"
tail -15 "$O/pytest.txt"
