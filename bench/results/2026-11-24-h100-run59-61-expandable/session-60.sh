#!/usr/bin/env bash
# Run 60 (issue 19): the Python package's tests on the H100 (torch, CuPy) with expandable heaps the C ABI default.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 560 python3 -m pytest -q -p no:cacheprovider python/tests > "$O/pytest.log" 2>&1
echo "pytest rc=$?" >> "$O/summary.txt"
grep -E "passed|failed|FAILED|Error" "$O/pytest.log" | tail -8 >> "$O/summary.txt"
cat "$O/summary.txt"
