#!/usr/bin/env bash
# Run 98: the suites on the GPU at the session's final code (graph pools
# under the device's limit, deferred frees' size check, raw handles made
# unsafe to wrap, pending blocks not held): the Rust suite against the real
# driver, then the Python package's tests with PyTorch and CuPy.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
t0=$(date +%s)
bash ./run-tests.sh "$O/tests" > "$O/tests.out" 2>&1
grep -v "rc=0 " "$O/tests.out" > "$S"
echo "rust suite: $(( $(date +%s) - t0 )) s" >> "$S"
t1=$(date +%s)
GPUMEM_DEVICE=cuda GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python PATH=$B/bin:$PATH \
  timeout 520 python3 -m pytest -q -rs -p no:cacheprovider python/tests > "$O/pytest.log" 2>&1
echo "pytest rc=$? in $(( $(date +%s) - t1 )) s: $(tail -1 "$O/pytest.log")" >> "$S"
cat "$S"
