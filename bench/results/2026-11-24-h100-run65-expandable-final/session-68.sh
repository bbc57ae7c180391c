#!/usr/bin/env bash
# Run 68 (issue 19): the Rust suite on the final code (growable ranges' give-back retries).
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 200 ./run-tests.sh "$O/tests" > "$O/tests-summary.txt" 2>&1; echo "run-tests rc=$?"
tail -1 "$O/tests-summary.txt"
grep -h -E "FAILED|panicked" -r "$O/tests" 2>/dev/null | head -8
grep -E 'pool_expandable|stress|fault_sweep' "$O/tests-summary.txt"
