#!/usr/bin/env bash
# Run 41 (issue 19): the final code: the Rust suite and the threads pass by pass.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_LIB=$B/lib/libgpumem.so PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
echo "== tests" | tee -a "$S"
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?" >> "$S"
tail -1 "$O/tests-summary.txt" >> "$S"
(cd "$O" && tar -czf tests-logs.tgz tests tests-summary.txt && rm -rf tests tests-summary.txt)
for n in 8 16; do timeout 60 bin/pool_threads $n 10000 4 contended >> "$O/pool_threads.txt" 2>&1; done
cat "$O/pool_threads.txt" >> "$S"
cat "$S"
