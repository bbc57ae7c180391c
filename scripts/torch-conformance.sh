#!/usr/bin/env bash
# PyTorch's own allocator tests (test_cuda.py) under PyTorch's allocator,
# gpumem's default and gpumem's vpool, each test in its own process; run
# from inside gpu-bundle on the GPU machine (scripts/gpu-bundle.sh copies
# the test file and the expecttest wheel it needs from ../shared and
# .whl). Writes under OUT_DIR (default ./out/conformance) and prints the
# table and the differences last.
#
# Usage: gpu-bundle/torch-conformance.sh [OUT_DIR] [extra run.py arguments]
#   CONFIGS (default torch,native:pool,native:vpool), JOBS (default: CPUs-2).
set -uo pipefail
cd "$(dirname "$0")"
out=${1:-out/conformance}
shift || true
[[ -f peer-tests/test_cuda.py ]] || { echo "no peer-tests/test_cuda.py in the bundle" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site wheels/*.whl \
  || exit 2
export PYTHONPATH=/tmp/site:$PWD/python GPUMEM_LIB=$PWD/lib/libgpumem.so PYTHONUNBUFFERED=1
# Hundreds of processes import PyTorch: compiled bytecode kept where it can
# be written saves each of them the compilation.
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/torch_extensions}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import gpumem.torch as g; g._build_native()' || exit 2
gpus=$(python3 -c 'import torch; print(",".join(map(str, range(torch.cuda.device_count()))))')
python3 python/conformance/run.py --test-file peer-tests/test_cuda.py --configs "${CONFIGS:-torch,native:pool,native:vpool}" \
  --gpus "$gpus" --jobs "${JOBS:-$(( $(nproc) - 2 ))}" --out "$out" "$@"
rc=$?
# The per-test reports travel packed; the work folder (the test file) not at all.
tar -czf "$out/reports.tgz" -C "$out" reports && rm -rf "$out/reports" "$out/work"
exit $rc
