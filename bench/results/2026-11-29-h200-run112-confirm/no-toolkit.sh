#!/usr/bin/env bash
# The native PyTorch allocator built where no CUDA toolkit can be found:
# CUDA_HOME and CUDA_PATH unset, no nvcc on PATH, and no /usr/local/cuda*:
# in a private mount namespace (unshare) /usr/local is an empty tmpfs with
# everything of the real one bound back but the cuda folders and links
# (PyTorch's lookup takes /usr/local/cuda whenever it exists, even empty).
# Where no namespace is allowed, PyTorch's lookup is emptied in the process
# instead, and the log says so. A fresh extensions folder forces the build.
set -u
py=$(mktemp /tmp/no-toolkit-XXXX.py)
cat > "$py" <<'PY'
import os, shutil, sys
from torch.utils import cpp_extension
if os.environ.get("HIDE_IN_PROCESS"):
    cpp_extension.CUDA_HOME = None
print("toolkit PyTorch finds:", cpp_extension.CUDA_HOME, "| nvcc on PATH:", shutil.which("nvcc"))
assert cpp_extension.CUDA_HOME is None, "a toolkit is still visible"
from gpumem import _cuda_home
print("runtime wheel:", _cuda_home.wheel_runtime())
import gpumem.torch as g
print("enable:", g.enable(mode="native"))
import torch
m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(256, 512, device="cuda"), torch.randint(0, 10, (256,), device="cuda")
for _ in range(5):
    loss = torch.nn.functional.cross_entropy(m(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
torch.cuda.synchronize()
st = torch.cuda.memory_stats()
print(f"mode={g.mode()} loss={loss.item():.4f} allocated={torch.cuda.memory_allocated()} "
      f"gpumem allocated={g.allocated_bytes()} reserved={torch.cuda.memory_reserved()} "
      f"num_alloc_retries={st.get('num_alloc_retries')}")
assert g.mode() == "native" and torch.cuda.memory_allocated() == g.allocated_bytes() > 0
print("native allocator without a toolkit: ok")
PY
path=$(echo "$PATH" | tr ':' '\n' | grep -v -i cuda | paste -sd:)
ext=$(mktemp -d /tmp/ext-XXXX)
run() { env -u CUDA_HOME -u CUDA_PATH PATH="$path" TORCH_EXTENSIONS_DIR="$ext" "$@"; }
hide='set -e; real=$(mktemp -d); mount --bind /usr/local "$real"; mount -t tmpfs none /usr/local
for e in "$real"/* "$real"/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  n=$(basename "$e"); case $n in cuda*) continue;; esac
  if [ -L "$e" ]; then ln -s "$(readlink "$e")" "/usr/local/$n"
  elif [ -d "$e" ]; then mkdir "/usr/local/$n"; mount --bind "$e" "/usr/local/$n"
  else touch "/usr/local/$n"; mount --bind "$e" "/usr/local/$n"; fi
done
ls /usr/local; exec python3 "$0"'
# A namespace whose mounts fail exits 32 before Python starts: then the
# lookup is emptied in the process.
rc=32
if [ -z "${IN_PROCESS:-}" ] && [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  echo "hiding /usr/local/cuda* in a private mount namespace (root)"
  run unshare -m sh -c "$hide" "$py"; rc=$?
elif [ -z "${IN_PROCESS:-}" ] && unshare -rm true 2>/dev/null; then
  echo "hiding /usr/local/cuda* in a private mount namespace"
  run unshare -rm sh -c "$hide" "$py"; rc=$?
fi
if [ $rc = 32 ]; then
  echo "no private mount namespace here: PyTorch's toolkit lookup is emptied in the process"
  HIDE_IN_PROCESS=1 run python3 "$py"; rc=$?
fi
exit $rc
