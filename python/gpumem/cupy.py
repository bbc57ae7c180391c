"""Route CuPy's device allocations through gpumem.

    import gpumem.cupy
    gpumem.cupy.enable()                     # GPUMEM_CONF, or gpumem.configure()'s
    gpumem.cupy.enable(resource="vpool", max_size="40GiB")   # the same, configured here

The keyword arguments are those of ``gpumem.configure`` (GPUMEM_CONF's keys).
PyTorch and CuPy in one process share gpumem's pool of each device.

Two modes:

- ``enable()`` (default) uses ``cupy.cuda.memory.CFunctionAllocator`` with
  libgpumem.so's ``gpumem_cupy_malloc``/``gpumem_cupy_free``. CuPy passes no
  stream to them, so memory is allocated and freed on the legacy default
  stream, which is CuPy's default stream. Work on other *blocking* streams is
  ordered with it by CUDA; with non-blocking streams of your own, use the
  second mode.
- ``enable(stream_aware=True)`` uses ``PythonFunctionAllocator`` and passes
  CuPy's current stream (``cupy.cuda.get_current_stream()``) to
  ``gpumem_malloc``, remembering it for the free: correct with any stream,
  at the cost of a Python call per allocation and free.

In both, a failed allocation raises ``cupy.cuda.memory.OutOfMemoryError``
(gpumem returns NULL and CuPy would not check it).
"""

import ctypes
import threading

from . import (  # noqa: F401
    allocated_bytes,
    bad_free_count,
    check_config,
    configure,
    empty_cache,
    library,
    library_path,
    peak_allocated_bytes,
    peak_reserved_bytes,
    reserved_bytes,
    reset_peak,
)

__all__ = [
    "enable",
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
    "reset_peak",
    "empty_cache",
    "bad_free_count",
]


def _cupy():
    try:
        import cupy  # the top-level package, not this module
    except ImportError as e:
        raise ImportError("gpumem.cupy needs CuPy (import cupy failed)") from e
    return cupy


def _oom(cupy, size, device):
    return cupy.cuda.memory.OutOfMemoryError(size, allocated_bytes(device), 0)


def enable(stream_aware=False, **settings):
    """Makes gpumem CuPy's allocator (``cupy.cuda.set_allocator``); returns
    the malloc function installed.

    `settings`, when given, configure gpumem first (``gpumem.configure``);
    else GPUMEM_CONF does. Raises ValueError for an invalid configuration
    (nothing is installed), ImportError without CuPy.
    """
    if settings:
        configure(**settings)
    else:
        check_config()
    cupy = _cupy()
    lib = library()
    if not stream_aware:
        malloc_addr = ctypes.cast(lib.gpumem_cupy_malloc, ctypes.c_void_p).value
        free_addr = ctypes.cast(lib.gpumem_cupy_free, ctypes.c_void_p).value
        alloc = cupy.cuda.memory.CFunctionAllocator(0, malloc_addr, free_addr, lib)

        def malloc(size):
            mem = alloc.malloc(size)
            if size and not mem.ptr:
                raise _oom(cupy, size, cupy.cuda.runtime.getDevice())
            return mem

    else:
        live = {}
        lock = threading.Lock()

        def _malloc(size, device_id):
            stream = cupy.cuda.get_current_stream().ptr
            ptr = lib.gpumem_malloc(size, device_id, stream)
            if not ptr:
                raise _oom(cupy, size, device_id)
            with lock:
                live[ptr] = (size, stream)
            return ptr

        def _free(ptr, device_id):
            with lock:
                size, stream = live.pop(ptr, (0, 0))
            lib.gpumem_free(ptr, size, device_id, stream)

        alloc = cupy.cuda.memory.PythonFunctionAllocator(_malloc, _free)
        malloc = alloc.malloc
    cupy.cuda.set_allocator(malloc)
    return malloc
