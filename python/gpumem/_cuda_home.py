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
"""

import glob
import hashlib
import os

# The wheel folders that hold a CUDA runtime, newest first.
_WHEEL_DIRS = ("cu13", "cu12", "cuda_runtime")


def wheel_runtime():
    """(include, lib) of an NVIDIA runtime wheel with the CUDA runtime's
    headers and library, or None when no such wheel is installed."""
    try:
        import nvidia  # a namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for base in list(getattr(nvidia, "__path__", [])):
        for sub in _WHEEL_DIRS:
            include = os.path.join(base, sub, "include")
            lib = os.path.join(base, sub, "lib")
            if os.path.isfile(os.path.join(include, "cuda_runtime_api.h")) and glob.glob(
                os.path.join(lib, "libcudart.so*")
            ):
                return include, lib
    return None


def cuda_home_from_wheel(cache_dir):
    """A CUDA home laid out under ``cache_dir`` from the installed NVIDIA
    runtime wheel (see the module documentation); its path, or None when
    no wheel has the runtime."""
    found = wheel_runtime()
    if found is None:
        return None
    include, lib = found
    home = os.path.join(cache_dir, "cuda_home-" + hashlib.sha256(include.encode()).hexdigest()[:12])
    lib64 = os.path.join(home, "lib64")
    os.makedirs(lib64, exist_ok=True)
    _link(include, os.path.join(home, "include"))
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
