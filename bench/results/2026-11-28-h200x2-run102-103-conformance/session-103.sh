#!/usr/bin/env bash
# Run 103: the classes run 102's deadline did not reach.
set -u
cd "$(dirname "$0")/../gpu-bundle"
O=${OUT:-/tmp/out}; mkdir -p "$O"
export GPUMEM_LIB=$PWD/lib/libgpumem.so TORCH_EXTENSIONS_DIR=$PWD/torch_extensions PYTHONPYCACHEPREFIX=/tmp/pycache
PYTHONPATH=$PWD/python python3 -c 'import gpumem.torch as g; g._build_native()' > "$O/build.log" 2>&1 || { tail -20 "$O/build.log"; exit 1; }
JOBS=30 ./torch-conformance.sh "$O/conf" --classes TestCudaMallocAsync,TestBlockStateAbsorption,TestMemPool \
  --deadline 120 --alone-time 25 --timeout 100 > "$O/conformance.log" 2>&1
tail -40 "$O/conformance.log"
