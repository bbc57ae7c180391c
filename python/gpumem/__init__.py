"""gpumem from Python: load libgpumem.so and read its statistics.

The shared library is found, in order, at ``$GPUMEM_LIB``; next to this
package (``gpumem/libgpumem.so``); in ``$CARGO_TARGET_DIR/{release,debug}``;
in the repository's ``target/{release,debug}``. Configure it with
``GPUMEM_CONF`` (read once, at the first allocation) and choose the backend
with ``GPUMEM_DEVICE`` (``cuda`` by default, ``sim`` for the simulated
device), both before the first call.

``gpumem.torch.enable()`` and ``gpumem.cupy.enable()`` route PyTorch's and
CuPy's allocations through it; both raise ``ValueError`` (from
``check_config()``) when ``GPUMEM_CONF`` is invalid, before installing
anything: an invalid configuration serves no allocation. The statistics below
are per device ordinal.
"""

import ctypes
import os

__all__ = [
    "library_path",
    "library",
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
    "reset_peak",
    "empty_cache",
    "bad_free_count",
    "config_error",
    "check_config",
]

LIB_NAME = "libgpumem.so"
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("GPUMEM_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, LIB_NAME)
    roots = []
    if os.environ.get("CARGO_TARGET_DIR"):
        roots.append(os.environ["CARGO_TARGET_DIR"])
    roots.append(os.path.join(os.path.dirname(os.path.dirname(here)), "target"))
    for root in roots:
        for profile in ("release", "debug"):
            yield os.path.join(root, profile, LIB_NAME)


def library_path():
    """The path of the libgpumem.so this package uses (resolved, absolute).

    Raises FileNotFoundError naming every place searched when there is none.
    """
    global _lib_path
    if _lib_path is None:
        tried = list(_candidates())
        for path in tried:
            if os.path.isfile(path):
                _lib_path = os.path.realpath(path)
                break
        else:
            raise FileNotFoundError(
                "gpumem: libgpumem.so not found; set GPUMEM_LIB to its path "
                "(build it with `cargo build --release -p gpumem-cdylib`). Tried: "
                + ", ".join(tried)
            )
    return _lib_path


def library():
    """The loaded library (a ctypes.CDLL with argument and result types set)."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(library_path())
        vp, ssz, sz, i = ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_size_t, ctypes.c_int
        sigs = {
            "gpumem_malloc": (vp, [ssz, i, vp]),
            "gpumem_free": (None, [vp, ssz, i, vp]),
            "gpumem_cupy_malloc": (vp, [vp, sz, i]),
            "gpumem_cupy_free": (None, [vp, vp, i]),
            "gpumem_allocated_bytes": (sz, [i]),
            "gpumem_peak_allocated_bytes": (sz, [i]),
            "gpumem_reserved_bytes": (sz, [i]),
            "gpumem_peak_reserved_bytes": (sz, [i]),
            "gpumem_reset_peak": (None, [i]),
            "gpumem_empty_cache": (None, [i]),
            "gpumem_bad_free_count": (ctypes.c_uint64, [i]),
            "gpumem_config_error": (ctypes.c_char_p, []),
        }
        for name, (res, args) in sigs.items():
            f = getattr(lib, name)
            f.restype = res
            f.argtypes = args
        _lib = lib
    return _lib


def allocated_bytes(device=0):
    """Bytes allocated on `device` and not freed (each rounded up to 256 B)."""
    return library().gpumem_allocated_bytes(device)


def peak_allocated_bytes(device=0):
    """Highest allocated_bytes since the start or the last reset_peak."""
    return library().gpumem_peak_allocated_bytes(device)


def reserved_bytes(device=0):
    """Bytes gpumem holds from the driver on `device` (allocated plus cached)."""
    return library().gpumem_reserved_bytes(device)


def peak_reserved_bytes(device=0):
    """Highest reserved_bytes since the start or the last reset_peak."""
    return library().gpumem_peak_reserved_bytes(device)


def reset_peak(device=0):
    """Resets the allocated and reserved peaks of `device` to the current values."""
    library().gpumem_reset_peak(device)


def empty_cache(device=0):
    """Gives the memory cached on `device` back to the driver."""
    library().gpumem_empty_cache(device)


def bad_free_count(device=-1):
    """Frees gpumem refused on `device` (pointers it did not hand out, second
    frees, wrong sizes; each freed nothing); -1: all devices."""
    return library().gpumem_bad_free_count(device)


def config_error():
    """Why GPUMEM_CONF is invalid (a str), or None when it is valid.

    The library reads GPUMEM_CONF once, at its first call: this call, if it
    is the first, so set GPUMEM_CONF before.
    """
    why = library().gpumem_config_error()
    return None if why is None else why.decode("utf-8", "replace")


def check_config():
    """Raises ValueError naming every problem when GPUMEM_CONF is invalid."""
    why = config_error()
    if why is not None:
        raise ValueError("gpumem: " + why)
