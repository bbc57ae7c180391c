"""gpumem as PyTorch's CUDA allocator.

Call ``enable()`` before PyTorch's first CUDA allocation (best: right after
``import torch``)::

    import torch
    import gpumem.torch
    gpumem.torch.enable(resource="vpool")   # settings as in GPUMEM_CONF

Two modes replace PyTorch's allocator, ``gpumem.torch.mode()`` says which one
is active:

- ``"native"`` (the default): a small C++ allocator (``csrc/
  torch_allocator.cpp``) built against the installed PyTorch with PyTorch's
  own extension builder the first time (cached afterwards, in
  ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``), installed as
  PyTorch's CUDA allocator. Everything PyTorch users rely on works:
  ``torch.OutOfMemoryError`` (gpumem first gives its cache back and retries
  once), ``torch.cuda.memory_stats()`` and the functions built on it,
  ``empty_cache``, ``set_per_process_memory_fraction``,
  ``Tensor.record_stream``, ``cudnn.benchmark`` (``cacheInfo``) and
  ``torch.cuda.memory._snapshot()``, and CUDA graphs (``torch.cuda.graph``,
  ``make_graphed_callables``, ``torch.compile(mode="reduce-overhead")``):
  memory allocated during a capture comes from a graph-private gpumem pool
  that keeps its addresses until the graph is deleted. A CUDA graph tree
  checkpoint that would have to re-create blocks is refused with an error,
  and so is CUDA IPC of tensors; both name the MemPool mode.
- ``"pluggable"``: ``torch.cuda.memory.CUDAPluggableAllocator`` over
  ``gpumem_malloc``/``gpumem_free``, used when the native allocator cannot be
  built (no compiler, another PyTorch version: ``enable()`` warns and says
  why, ``native_error()`` keeps it) or when asked for. PyTorch's statistics,
  ``empty_cache`` and ``cacheInfo`` do not reach it (``cudnn.benchmark``
  fails), and an out-of-memory returns a null tensor: use native.

A third way keeps PyTorch's allocator and routes one region of code through
gpumem: ``pool = gpumem.torch.mempool()`` returns a ``torch.cuda.MemPool``
whose segments come from gpumem; ``with torch.cuda.use_mem_pool(pool): ...``
allocates there. PyTorch's caching allocator stays in charge (statistics,
graphs, out-of-memory errors all work) and asks gpumem only for segments.

``GPUMEM_TORCH_MODE=native|pluggable`` chooses the mode when ``enable()`` is
called without one.

Sleep and wake (with ``resource="vpool"``, native or pluggable mode): every
tensor PyTorch allocates inside ``with gpumem.torch.region("weights"):``
belongs to region "weights"; ``gpumem.torch.sleep("weights")`` gives their
GPU memory back to the driver (their contents first copied to pinned host
memory; ``backup=False`` drops them, as for a KV cache) and
``gpumem.torch.wake("weights")`` brings it back at the same addresses, so
the tensors, and CUDA graphs captured with them, work again. A name maps to
a small integer tag, the same for the whole process (``gpumem.regions``).
Tensors of a region asleep must not be used; freeing them is fine.
"""

import ctypes
import os
import warnings

from . import regions as _regions

from . import (  # noqa: F401  (re-exported statistics)
    allocated_bytes as _allocated_bytes,
    bad_free_count,
    check_config,
    configure,
    empty_cache as _empty_cache,
    include_dir,
    library,
    library_path,
    peak_allocated_bytes as _peak_allocated_bytes,
    peak_reserved_bytes as _peak_reserved_bytes,
    reserved_bytes as _reserved_bytes,
    reset_peak as _reset_peak,
)

__all__ = [
    "enable",
    "is_enabled",
    "mode",
    "native_error",
    "mempool",
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
    "reset_peak",
    "empty_cache",
    "bad_free_count",
    "region",
    "sleep",
    "wake",
    "sleeping_bytes",
]

MODE_ENV = "GPUMEM_TORCH_MODE"

# The C ABI functions the native allocator calls, in the order of
# `struct gpumem_torch_api` in csrc/torch_allocator.cpp.
_API = (
    "malloc_rounded",
    "free_rounded",
    "last_error",
    "get_device_stats",
    "reset_peak_stats",
    "reset_accumulated_stats",
    "empty_cache",
    "set_memory_fraction",
    "get_memory_fraction",
    "record_stream",
    "snapshot",
    "graph_pool_begin",
    "graph_pool_end",
    "graph_pool_retain",
    "graph_pool_release",
    "graph_pool_use_count",
    "graph_pool_malloc",
    "graph_pool_free",
    "graph_pool_hold_rounded",
    "graph_pool_checkpoint",
    "checkpoint_free",
    "graph_pool_restore",
    "restored_freed",
    "restored_made",
    "restored_free",
    "graph_pool_live_blocks",
    "graph_pool_block",
    "get_class_stats",
    "set_graph_capture_reuse",
    "pool_snapshot",
    "pool_empty_cache",
    "graph_pool_set_no_split",
    "graph_pool_set_use_on_oom",
    "graph_pool_retain_foreign",
)

_mode = None
_native_error = None
_keep = []  # objects that must outlive the process's allocations


def _torch():
    try:
        import torch  # the top-level package, not this module
    except ImportError as e:
        raise ImportError("gpumem.torch needs PyTorch (import torch failed)") from e
    return torch


class _ApiTable(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in _API]


def _build_native():
    """Builds (or finds cached) the native allocator; returns its path."""
    from torch.utils import cpp_extension

    csrc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
    source = os.path.join(csrc, "torch_allocator.cpp")
    if not os.path.isfile(source):
        raise FileNotFoundError(f"the native allocator's source is missing: {source}")
    # PyTorch's builder rebuilds when the source changes, not when a header
    # it includes does: the name carries a digest of every file of csrc.
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(os.listdir(csrc)):
        with open(os.path.join(csrc, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    # Without an architecture list the builder asks the GPU for its compute
    # capability, which initialises CUDA, after which PyTorch's allocator can
    # no longer be replaced. The source is plain C++ (no device code), so the
    # list only has to be there.
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    # No CUDA toolkit: the headers and libcudart of the NVIDIA runtime wheel
    # that PyTorch's own wheel depends on, laid out as the builder expects.
    toolkit = cpp_extension.CUDA_HOME
    if toolkit is None:
        from . import _cuda_home

        home = _cuda_home.cuda_home_from_wheel(cpp_extension.get_default_build_root())
        if home is None:
            raise RuntimeError(
                "the native allocator needs the CUDA runtime's headers: there is no CUDA toolkit "
                "(CUDA_HOME, nvcc on PATH) and no NVIDIA runtime wheel with cuda_runtime_api.h "
                "(pip install nvidia-cuda-runtime-cu13, or nvidia-cuda-runtime-cu12 for CUDA 12); "
                "or use enable(mode='pluggable')"
            )
        cpp_extension.CUDA_HOME = home
    try:
        return cpp_extension.load(
            name="gpumem_torch_allocator_" + digest.hexdigest()[:12],
            sources=[source],
            extra_cflags=["-O2"],
            extra_include_paths=[include_dir()],
            with_cuda=True,
            is_python_module=False,
            verbose=bool(os.environ.get("GPUMEM_VERBOSE_BUILD")),
        )
    finally:
        cpp_extension.CUDA_HOME = toolkit
        if arch is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]


def _install_native():
    lib = library()
    missing = [n for n in _API if not hasattr(lib, "gpumem_" + n)]
    if missing:
        raise RuntimeError(
            f"{library_path()} lacks {', '.join('gpumem_' + n for n in missing)} (an older build?)"
        )
    table = _ApiTable(*[ctypes.cast(getattr(lib, "gpumem_" + n), ctypes.c_void_p).value for n in _API])
    native = ctypes.CDLL(_build_native())
    native.gpumem_torch_install.argtypes = [ctypes.POINTER(_ApiTable), ctypes.c_char_p, ctypes.c_size_t]
    native.gpumem_torch_install.restype = ctypes.c_int
    error = ctypes.create_string_buffer(1024)
    if native.gpumem_torch_install(ctypes.byref(table), error, len(error)) != 0:
        raise RuntimeError(error.value.decode(errors="replace"))
    _keep.extend([native, table])


def _install_pluggable():
    torch = _torch()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "gpumem_malloc", "gpumem_free")
    torch.cuda.memory.change_current_allocator(alloc)
    _keep.append(alloc)


def _before_cuda(torch, what):
    if torch.cuda.is_initialized():
        raise RuntimeError(
            f"gpumem.torch.{what}() must run before PyTorch initialises CUDA (its first "
            "CUDA tensor, or torch.cuda.init()): allocations cannot move between allocators"
        )


def enable(mode=None, **settings):
    """Makes gpumem PyTorch's CUDA allocator; returns the mode installed.

    ``mode``: ``"native"`` (raise if it cannot be built), ``"pluggable"``, or
    ``None``: ``GPUMEM_TORCH_MODE``, else native with a fallback to pluggable
    (with a warning that says why). ``settings`` are GPUMEM_CONF's keys
    (``resource="vpool"``, ``max_size="70GiB"``, ``log="job.csv"``, ...).

    Idempotent once installed. Raises ValueError for an invalid configuration
    (nothing is installed), RuntimeError if CUDA was already initialised with
    PyTorch's allocator.
    """
    global _mode, _native_error
    if _mode is not None:
        return _mode
    if settings:
        configure(**settings)
    check_config()
    torch = _torch()
    _before_cuda(torch, "enable")
    want = mode or os.environ.get(MODE_ENV, "").strip().lower() or None
    if want not in (None, "native", "pluggable"):
        raise ValueError(f"gpumem.torch.enable: mode {want!r}: expected 'native' or 'pluggable'")
    if want in (None, "native"):
        try:
            _install_native()
            _mode = "native"
            return _mode
        except Exception as e:  # noqa: BLE001  (any build or install failure)
            if want == "native":
                raise RuntimeError(f"gpumem's native PyTorch allocator is unavailable: {e}") from e
            _native_error = str(e)
            warnings.warn(
                "gpumem: the native PyTorch allocator is unavailable, using the pluggable one "
                f"(no memory_stats, cudnn.benchmark or OutOfMemoryError): {e}",
                RuntimeWarning,
                stacklevel=2,
            )
    _install_pluggable()
    _mode = "pluggable"
    return _mode


def mode():
    """``"native"`` or ``"pluggable"`` once ``enable()`` succeeded, else None."""
    return _mode


def native_error():
    """Why the native allocator could not be used (None if it was, or not tried)."""
    return _native_error


def is_enabled():
    """True once enable() has succeeded in this process."""
    return _mode is not None


def mempool(**settings):
    """A ``torch.cuda.MemPool`` whose segments come from gpumem.

    For programs that keep PyTorch's allocator and route a region of code
    through gpumem::

        pool = gpumem.torch.mempool(resource="vpool")
        with torch.cuda.use_mem_pool(pool):
            kv_cache = torch.empty(...)

    PyTorch's caching allocator stays in charge of the pool (it caches on top
    and asks gpumem for segments), so statistics, CUDA graphs and
    ``torch.OutOfMemoryError`` work as with PyTorch alone. ``settings`` as in
    ``enable()``; they configure gpumem for the whole process.

    CUDA IPC (``torch.multiprocessing`` sending a tensor of the pool to
    another process) needs ``cuMemAlloc`` memory: ``cudaIpcGetMemHandle``
    refuses VMM memory, and PyTorch then raises "CUDA error: invalid
    argument". So for ``resource="pool"`` (the default) and ``"binning"``
    this takes separate regions (``expandable=False``) unless ``expandable``
    or ``recycle`` (which needs expandable heaps) is given, or GPUMEM_CONF
    is set in the environment (then it is obeyed:
    add ``expandable=false`` there for IPC), or gpumem already serves
    allocations with another configuration (which stays). ``vpool``'s
    memory is VMM memory: no IPC of its tensors.
    """
    implicit = False
    chosen = "expandable" in settings or settings.get("recycle")
    if settings.get("resource", "pool") in ("pool", "binning") and not chosen:
        if settings or not os.environ.get("GPUMEM_CONF", "").strip():
            implicit = True
    if implicit:
        try:
            configure(**dict(settings, expandable=False))
        except ValueError:
            # Configured already (the first allocation fixes it): the
            # settings as given must match it, or none were given.
            if settings:
                configure(**settings)
    elif settings:
        configure(**settings)
    check_config()
    torch = _torch()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "gpumem_malloc", "gpumem_free")
    _keep.append(alloc)
    return torch.cuda.MemPool(alloc.allocator())


def _device(device):
    if device is None:
        return _torch().cuda.current_device()
    if hasattr(device, "index"):  # torch.device
        return 0 if device.index is None else device.index
    return int(device)


def allocated_bytes(device=None):
    """Bytes allocated on `device` (default: the current device)."""
    return _allocated_bytes(_device(device))


def peak_allocated_bytes(device=None):
    """Highest allocated_bytes since the start or the last reset_peak."""
    return _peak_allocated_bytes(_device(device))


def reserved_bytes(device=None):
    """Bytes gpumem holds from the driver on `device`."""
    return _reserved_bytes(_device(device))


def peak_reserved_bytes(device=None):
    """Highest reserved_bytes since the start or the last reset_peak."""
    return _peak_reserved_bytes(_device(device))


def reset_peak(device=None):
    """Resets both peaks of `device`."""
    _reset_peak(_device(device))


def empty_cache(device=None):
    """Gives the memory cached on `device` back to the driver."""
    _empty_cache(_device(device))


def region(name, device=None):
    """A context manager: the tensors allocated on `device` (default: the
    current device) inside it belong to region `name` (a str, or an int tag
    from 1 up; see ``gpumem.regions``). Regions nest. Needs
    ``resource="vpool"``; raises ``gpumem.regions.RegionError`` otherwise."""
    return _regions.region(name, _device(device))


def sleep(name, backup=True, device=None):
    """Gives the GPU memory of region `name`'s tensors back to the driver,
    after all work on `device` is done; with `backup`, their contents are
    copied to pinned host memory first and ``wake`` restores them, else they
    come back undefined (a KV cache). The tensors keep their addresses; do
    not use them until ``wake``. Raises ``gpumem.regions.RegionError`` (and
    the region stays awake) on failure."""
    _regions.sleep(name, backup, _device(device))


def wake(name, device=None):
    """Maps GPU memory again under region `name`'s tensors, at the same
    addresses, and restores their contents if they slept with a backup.
    Raises ``gpumem.regions.RegionError`` (the region still asleep, e.g. out
    of memory) on failure."""
    _regions.wake(name, _device(device))


def sleeping_bytes(name, device=None):
    """Bytes of region `name`'s tensors asleep on `device` (0 while awake)."""
    return _regions.sleeping_bytes(name, _device(device))
