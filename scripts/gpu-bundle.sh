#!/usr/bin/env bash
# Builds everything the GPU run needs, in release mode, into ./gpu-bundle
# (git-ignored): every test binary of the workspace, the `gpumem` command, the
# traces, and run-tests.sh, which runs the whole suite against the real driver
# (GPUMEM_DEVICE=cuda) and prints the counts; then packs it into
# ./gpu-bundle.tar.xz (git-ignored, kept under 64 MiB: the test binaries share
# most of their code, which one solid archive stores once).
#
# It also carries the scripts for several GPUs (multi-gpu.sh) and for
# PyTorch's own allocator tests (torch-conformance.sh): PyTorch's test file
# comes from ../shared/peer-tests/pytorch (never committed here) and the
# wheels the GPU machine lacks from ./.whl (git-ignored; see
# torch-conformance.sh for what goes there).
#
# Usage: scripts/gpu-bundle.sh [--torch-only] [TRACES_DIR]   (default: traces, the repository's)
#   --torch-only: only what PyTorch runs need (libgpumem.so, python/, the
#   scripts, PyTorch's test file and the wheels), without the test binaries
#   and programs, which take most of the build time.
# Then on the GPU machine: tar -xJf gpu-bundle.tar.xz && gpu-bundle/run-tests.sh [LOG_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
torch_only=false
if [[ ${1:-} == --torch-only ]]; then torch_only=true; shift; fi
traces=${1:-traces}
out=gpu-bundle
tgt=${CARGO_TARGET_DIR:-target}
rm -rf "$out"
mkdir -p "$out/tests" "$out/bin" "$out/traces"

# Only what this checkout builds (a shared target directory may hold others').
$torch_only || cargo build --release --workspace --bins --examples --message-format=json 2>/dev/null \
  | jq -r 'select(.reason == "compiler-artifact" and .executable != null) | .executable' \
  | sort -u | while read -r exe; do
      cp "$exe" "$out/bin/"
    done
# libgpumem.so (the C ABI for PyTorch and CuPy): a cdylib, not a bin.
if [[ -f crates/gpumem-capi/cdylib/Cargo.toml ]]; then
  cargo build --release -p gpumem-cdylib
fi
$torch_only || cargo test --release --workspace --no-run --message-format=json 2>/dev/null \
  | jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test == true) | .executable' \
  | sort -u | while read -r exe; do
      cp "$exe" "$out/tests/"
    done
strip "$out"/tests/* "$out"/bin/* 2>/dev/null || true
if [[ -d $traces ]]; then cp "$traces"/*.csv "$out/traces/"; fi
cp scripts/run-tests.sh scripts/gpu-run.sh scripts/multi-gpu.sh scripts/torch-conformance.sh scripts/view-real-job.sh \
  scripts/real-jobs-session.sh "$out/"
peer=${PEER_TESTS:-../shared/peer-tests/pytorch}
if [[ -f $peer/test_cuda.py ]]; then
  mkdir -p "$out/peer-tests" && cp "$peer/test_cuda.py" "$peer/LICENSE-pytorch.txt" "$out/peer-tests/"
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  mkdir -p "$out/wheels" && cp .whl/*.whl "$out/wheels/"
fi
# The Python package as a wheel, when one was built (pip wheel ./python -w
# dist): the GPU run installs it as a user would.
if compgen -G "dist/gpumem_rs-*.whl" >/dev/null; then
  mkdir -p "$out/pkg" && cp dist/gpumem_rs-*.whl "$out/pkg/"
fi
mkdir -p "$out/fonts"
cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf "$out/fonts/" 2>/dev/null || true
# The C ABI library and the Python helpers, when built.
if [[ -f crates/gpumem-capi/Cargo.toml && -f "$tgt/release/libgpumem.so" ]]; then
  mkdir -p "$out/lib" && cp "$tgt/release/libgpumem.so" "$out/lib/" && strip "$out/lib/libgpumem.so"
fi
if [[ -d python ]]; then
  cp -r python "$out/python"
  # GPUMEM_LIB names lib/libgpumem.so there; no stale copy or caches travel.
  rm -f "$out/python/gpumem/libgpumem.so"
  # The C ABI's header, where gpumem.include_dir() finds it in a package.
  mkdir -p "$out/python/gpumem/include" && cp crates/gpumem-capi/include/gpumem.h "$out/python/gpumem/include/"
  find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
fi

tar -cJf "$out.tar.xz" "$out"
size=$(du -sm "$out" | cut -f1)
packed=$(du -sm "$out.tar.xz" | cut -f1)
echo "gpu-bundle: $(ls "$out/tests" | wc -l) test binaries, $(ls "$out/bin" | wc -l) programs, ${size} MiB; $out.tar.xz ${packed} MiB"
if (( packed >= 64 )); then
  echo "$out.tar.xz is ${packed} MiB: over the 64 MiB the GPU machine accepts" >&2
  exit 1
fi
