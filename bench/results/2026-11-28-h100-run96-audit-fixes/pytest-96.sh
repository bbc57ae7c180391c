#!/usr/bin/env bash
# Run 96, second call: the Python package's tests with PyTorch 2.11 and CuPy
# on the GPU, through libgpumem.so of the audit fixes.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
GPUMEM_DEVICE=cuda GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python \
  timeout 560 python3 -m pytest -q -p no:cacheprovider python/tests > "$O/pytest.log" 2>&1
echo "pytest rc=$?" >> "$O/pytest.log"
tail -5 "$O/pytest.log"
