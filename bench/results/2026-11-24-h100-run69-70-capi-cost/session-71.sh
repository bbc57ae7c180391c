#!/usr/bin/env bash
# Run 71 (issue 19): the final code (af6c3c5: last error behind a count of threads
# holding one) on the H100: the Rust suite, then the Python package's tests
# (torch, CuPy) through libgpumem.so.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -8 >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
timeout 380 python3 -m pytest -q -p no:cacheprovider python/tests > "$O/pytest.log" 2>&1
echo "pytest rc=$?" >> "$S"
grep -E "passed|failed|FAILED|Error" "$O/pytest.log" | tail -8 >> "$S"
cat "$S"
