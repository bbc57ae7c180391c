"""Route PyTorch's CUDA allocations through gpumem.

Call ``enable()`` before PyTorch's first CUDA allocation (best: right after
``import torch``, before anything touches ``cuda``)::

    import gpumem.torch
    gpumem.torch.enable()

It uses ``torch.cuda.memory.CUDAPluggableAllocator`` with libgpumem.so's
``gpumem_malloc``/``gpumem_free``. PyTorch's own memory statistics
(``torch.cuda.memory_allocated`` and friends) and ``torch.cuda.empty_cache``
do not reach a pluggable allocator; use the functions of this module instead.

Out of memory: gpumem returns NULL and prints ``gpumem: device N: allocation
of ... failed`` on stderr. PyTorch 2.11 does not check the NULL: the tensor
gets data pointer 0 and the first operation on it raises ``RuntimeError: The
tensor has a non-zero number of elements, but its data is not allocated
yet`` (not ``torch.cuda.OutOfMemoryError``). ``examples/torch_oom_probe.py``
shows what a given PyTorch does.
"""

from . import (  # noqa: F401  (re-exported statistics)
    allocated_bytes as _allocated_bytes,
    bad_free_count,
    check_config,
    empty_cache as _empty_cache,
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
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
    "reset_peak",
    "empty_cache",
    "bad_free_count",
]

_allocator = None


def _torch():
    try:
        import torch  # the top-level package, not this module
    except ImportError as e:
        raise ImportError("gpumem.torch needs PyTorch (import torch failed)") from e
    return torch


def enable():
    """Makes gpumem PyTorch's CUDA allocator; returns the pluggable allocator.

    Idempotent. Raises ValueError if GPUMEM_CONF is invalid (nothing is
    installed), RuntimeError if CUDA was already initialised with another
    allocator (allocations cannot move between allocators).
    """
    global _allocator
    if _allocator is not None:
        return _allocator
    check_config()
    torch = _torch()
    path = library_path()
    library()  # the same file, so the statistics read PyTorch's allocator
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "gpumem_malloc", "gpumem_free")
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError(
            "gpumem.torch.enable() must run before PyTorch initialises CUDA "
            "(its first CUDA tensor, or torch.cuda.init()); PyTorch already uses "
            "its own allocator in this process: " + str(e)
        ) from e
    _allocator = alloc
    return alloc


def is_enabled():
    """True once enable() has succeeded in this process."""
    return _allocator is not None


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
