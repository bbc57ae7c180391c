#!/usr/bin/env bash
# Runs every test binary in ./tests against the backend GPUMEM_DEVICE names
# (default: cuda) and prints one line per binary and the totals last.
# Usage: run-tests.sh [LOG_DIR]
#   TEST_TIMEOUT: seconds one binary may take (default 300); one that hangs
#   is counted as failing instead of eating the whole device call.
set -uo pipefail
cd "$(dirname "$0")"
logs=${1:-logs}
mkdir -p "$logs"
export GPUMEM_DEVICE=${GPUMEM_DEVICE:-cuda}
# Tests that run the command find it here rather than in the build tree.
export GPUMEM_BIN=$PWD/bin/gpumem
# The plot tests need a TrueType font; the bundle carries one.
[[ -f fonts/DejaVuSans.ttf ]] && export GPUMEM_FONT=${GPUMEM_FONT:-$PWD/fonts/DejaVuSans.ttf}
passed=0 failed=0 ignored=0 bad=()
for t in tests/*; do
  name=$(basename "$t")
  timeout "${TEST_TIMEOUT:-300}" "$t" --test-threads=4 >"$logs/$name.log" 2>&1
  rc=$?
  (( rc == 124 )) && echo "timed out after ${TEST_TIMEOUT:-300} s" >>"$logs/$name.log"
  p=$(grep -Eo '[0-9]+ passed' "$logs/$name.log" | awk '{s+=$1} END {print s+0}')
  f=$(grep -Eo '[0-9]+ failed' "$logs/$name.log" | awk '{s+=$1} END {print s+0}')
  i=$(grep -Eo '[0-9]+ ignored' "$logs/$name.log" | awk '{s+=$1} END {print s+0}')
  passed=$((passed + p)) failed=$((failed + f)) ignored=$((ignored + i))
  printf '%-40s rc=%d passed=%d failed=%d ignored=%d\n' "$name" "$rc" "$p" "$f" "$i"
  if (( rc != 0 )); then bad+=("$name"); fi
done
echo "backend=$GPUMEM_DEVICE: $passed passed, $failed failed, $ignored ignored; failing binaries: ${bad[*]:-none}"
(( ${#bad[@]} == 0 ))
