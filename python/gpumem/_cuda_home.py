"""The CUDA headers and runtime library for building the native allocator
where no CUDA toolkit is installed.

PyTorch's pip wheels depend on NVIDIA's runtime wheels, which ship the
CUDA runtime's headers and ``libcudart`` under ``site-packages/nvidia``
(``cu13/`` for CUDA 13, ``cuda_runtime/`` for CUDA 12), but no toolkit.
The native allocator is plain C++ (no device code), so those are all its
build needs. PyTorch's extension builder, though, looks for them under a
CUDA home (``include/`` and ``lib64/``, linking ``-lcudart``), so this
module lays one out from the wheel: a folder whose ``include`` is the
wheel's and whose ``lib64`` links to the wheel's libraries, with the
unversioned ``libcudart.so`` the linker asks for.

``cuda_runtime.h`` includes ``crt/host_config.h`` and its siblings, which
CUDA 13's runtime wheel does not ship (they are in ``nvidia-cuda-crt``;
CUDA 12's are in ``nvidia-cuda-nvcc-cu12``). Where the runtime wheel lacks
them, the home's ``include`` is a folder of links to the wheel's headers
plus a ``crt`` taken from another NVIDIA wheel, else from Triton, which
PyTorch's Linux wheels depend on and which ships CUDA's headers for its
own compiler (of its CUDA version: the allocator uses only host
declarations from them).
"""

import glob
import hashlib
import importlib.util
import os

# The wheel folders that hold a CUDA runtime, newest first.
_WHEEL_DIRS = ("cu13", "cu12", "cuda_runtime")


def wheel_runtime():
    """(include, lib) of an NVIDIA runtime wheel with the CUDA runtime's
    headers and library, or None when no such wheel is installed."""
    for base in _nvidia_bases():
        for sub in _WHEEL_DIRS:
            include = os.path.join(base, sub, "include")
            lib = os.path.join(base, sub, "lib")
            if os.path.isfile(os.path.join(include, "cuda_runtime_api.h")) and glob.glob(
                os.path.join(lib, "libcudart.so*")
            ):
                return include, lib
    return None


def _nvidia_bases():
    try:
        import nvidia  # a namespace package of NVIDIA's wheels
    except ImportError:
        return []
    return list(getattr(nvidia, "__path__", []))


def crt_headers(include):
    """The ``crt`` folder (with ``host_config.h``) that the headers under
    ``include`` need: their own, else one from another NVIDIA wheel
    (``nvidia-cuda-crt`` for CUDA 13, ``nvidia-cuda-nvcc-cu12`` for 12), else
    Triton's; None when there is none."""
    candidates = [os.path.join(include, "crt")]
    for base in _nvidia_bases():
        for sub in _WHEEL_DIRS + ("cuda_nvcc",):
            candidates.append(os.path.join(base, sub, "include", "crt"))
    # Located without importing Triton (which would load its compiler).
    spec = importlib.util.find_spec("triton")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(os.path.join(loc, "backends", "nvidia", "include", "crt"))
    for crt in candidates:
        if os.path.isfile(os.path.join(crt, "host_config.h")):
            return crt
    return None


def cuda_home_from_wheel(cache_dir):
    """A CUDA home laid out under ``cache_dir`` from the installed NVIDIA
    runtime wheel (see the module documentation); its path, or None when
    no wheel has the runtime. Raises RuntimeError, saying what to install,
    when the runtime wheel is there but no ``crt`` headers are."""
    found = wheel_runtime()
    if found is None:
        return None
    include, lib = found
    crt = crt_headers(include)
    if crt is None:
        raise RuntimeError(
            f"the CUDA runtime's headers in {include} include crt/host_config.h, which neither that wheel "
            "nor any other installed one ships: pip install nvidia-cuda-crt (CUDA 13) or "
            "nvidia-cuda-nvcc-cu12 (CUDA 12), or install a CUDA toolkit"
        )
    own = os.path.dirname(crt) == include
    key = include if own else include + "\0" + crt
    home = os.path.join(cache_dir, "cuda_home-" + hashlib.sha256(key.encode()).hexdigest()[:12])
    lib64 = os.path.join(home, "lib64")
    os.makedirs(lib64, exist_ok=True)
    if own:
        _link(include, os.path.join(home, "include"))
    else:
        merged = os.path.join(home, "include")
        os.makedirs(merged, exist_ok=True)
        for name in os.listdir(include):
            if name != "crt":
                _link(os.path.join(include, name), os.path.join(merged, name))
        _link(crt, os.path.join(merged, "crt"))
    for path in glob.glob(os.path.join(lib, "*.so*")):
        _link(path, os.path.join(lib64, os.path.basename(path)))
    # The linker's -lcudart wants the unversioned name the wheel lacks.
    versioned = sorted(glob.glob(os.path.join(lib, "libcudart.so.*")))
    if versioned and not os.path.exists(os.path.join(lib64, "libcudart.so")):
        _link(versioned[-1], os.path.join(lib64, "libcudart.so"))
    return home


def _link(target, name):
    """Points the symbolic link ``name`` at ``target`` (made again when it
    points elsewhere)."""
    if os.path.islink(name):
        if os.readlink(name) == target:
            return
        os.unlink(name)
    try:
        os.symlink(target, name)
    except FileExistsError:
        # Another process laid the same home out at the same moment.
        if not (os.path.islink(name) and os.readlink(name) == target):
            raise
