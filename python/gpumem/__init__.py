"""gpumem from Python: load libgpumem.so, configure it, read its statistics.

The shared library is found, in order, at ``$GPUMEM_LIB``; inside this
package (``gpumem/libgpumem.so``, where ``pip install`` puts it); in
``$CARGO_TARGET_DIR/{release,debug}``; in the repository's
``target/{release,debug}``. Choose the backend with ``GPUMEM_DEVICE``
(``cuda`` by default, ``sim`` for the simulated device) before the first
call.

Configure it with ``configure(resource="vpool", max_size="40GiB")`` (the keys
of ``GPUMEM_CONF``, which it overrides) before the first allocation, or with
``GPUMEM_CONF``, read at the first call when ``configure`` was not called.
``gpumem.torch.enable()`` and ``gpumem.cupy.enable()`` take the same
settings and route PyTorch's and CuPy's allocations through it; both raise
``ValueError`` for an invalid configuration, before installing anything: an
invalid configuration serves no allocation. The statistics below are per
device ordinal.
"""

import ctypes
import difflib
import os

from . import _abi

__all__ = [
    "library_path",
    "library",
    "include_dir",
    "configure",
    "conf_text",
    "SETTINGS",
    "device_stats",
    "last_error",
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
    "reset_peak",
    "empty_cache",
    "bad_free_count",
    "mapping_changes",
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
                "gpumem: libgpumem.so not found; install the package with "
                "`pip install ./python` (it builds the library inside), or set "
                "GPUMEM_LIB to a libgpumem.so built with "
                "`cargo build --release -p gpumem-cdylib`. Tried: "
                + ", ".join(tried)
            )
    return _lib_path


def library():
    """The loaded library (a ctypes.CDLL with argument and result types set;
    see gpumem._abi for the structures of its newer functions)."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(library_path())
        _abi.declare(lib)
        _lib = lib
    return _lib


def include_dir():
    """The folder holding gpumem.h, the C ABI's header: inside the installed
    package, else the repository's crates/gpumem-capi/include."""
    here = os.path.dirname(os.path.abspath(__file__))
    installed = os.path.join(here, "include")
    if os.path.isfile(os.path.join(installed, "gpumem.h")):
        return installed
    return os.path.join(os.path.dirname(os.path.dirname(here)), "crates", "gpumem-capi", "include")


# The keys of GPUMEM_CONF (crates/gpumem-capi/src/conf.rs documents them).
SETTINGS = (
    "resource", "initial_size", "max_size", "release_threshold", "min_bin", "max_bin",
    "shards", "spread", "expandable", "recycle", "nccl_ready", "log",
)
# The settings that take True or False.
SWITCHES = ("expandable", "recycle", "nccl_ready")


def conf_text(**settings):
    """The GPUMEM_CONF text for `settings` (the keyword arguments of
    ``configure``), e.g. ``conf_text(resource="vpool", max_size=1 << 30)`` is
    ``"resource=vpool,max_size=1073741824"``.

    Checks what can be checked without the library: raises ValueError for an
    unknown key (naming the closest one), a value that is not an int, a str,
    a path or None, a negative int, or a value with a comma or a NUL
    character (C reads a string up to its first NUL: the library would see
    another value). None leaves the key at its default. The library checks
    the values themselves.
    """
    parts = []
    for key, value in settings.items():
        if key not in SETTINGS:
            close = difflib.get_close_matches(key, SETTINGS, n=1)
            hint = ' (did you mean "%s"?)' % close[0] if close else ""
            raise ValueError(
                'gpumem: unknown setting "%s"%s; the settings are %s'
                % (key, hint, ", ".join(SETTINGS))
            )
        if value is None:
            continue
        if key in SWITCHES and isinstance(value, bool):
            parts.append("%s=%s" % (key, "true" if value else "false"))
            continue
        if isinstance(value, bool) or not isinstance(value, (int, str, os.PathLike)):
            raise ValueError(
                "gpumem: %s=%r: expected bytes as an int, a string (\"40GiB\", "
                "\"none\", a name or a path) or None" % (key, value)
            )
        if isinstance(value, int) and value < 0:
            raise ValueError("gpumem: %s=%d: a size cannot be negative" % (key, value))
        text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        if "," in text:
            raise ValueError(
                "gpumem: %s=%r: GPUMEM_CONF separates settings with commas, so a "
                "value cannot hold one" % (key, text)
            )
        if "\0" in text:
            raise ValueError(
                "gpumem: %s=%r: a value cannot hold a NUL character (the library "
                "would read only what comes before it)" % (key, text)
            )
        parts.append("%s=%s" % (key, text))
    return ",".join(parts)


def configure(**settings):
    """Configures gpumem for this process; returns the GPUMEM_CONF text used.

    The keyword arguments are GPUMEM_CONF's keys (SETTINGS): ``resource``,
    ``initial_size``, ``max_size``, ``release_threshold``, ``min_bin``,
    ``max_bin``, ``shards`` (lock shards of ``pool`` and ``vpool``: 0, the default, for one
    per CPU; 1 for one lock), ``spread`` (``"contended"``, the default: the
    threads use the shards once they contend for one lock; ``"always"``),
    ``expandable`` (True, the default: the heaps of ``pool`` and ``binning``
    each grow one address range in place; False: separate ``cuMemAlloc``
    regions, which CUDA IPC needs), ``recycle`` (True: before an expandable
    heap grows, free pieces of its ranges move to its end instead of new
    memory being made; leaner on training, slower on a workload that empties
    the pool and refills it differently; False, the default), ``nccl_ready`` (True: the vpool's
    NCCL-ready mode) and
    ``log`` (a file to write the RMM CSV log of every allocation to). Values are ints (bytes), strings (``"40GiB"``,
    ``"none"``, ``"vpool"``, a path) or None (the default). They replace
    GPUMEM_CONF as a whole.

    Call it before the first allocation; afterwards only the configuration in
    force is accepted again. Raises ValueError, with the library's reason, for
    an unknown key, a bad value, or a different configuration after the first
    allocation; nothing changes then.
    """
    text = conf_text(**settings)
    lib = _newer("gpumem_configure")
    if lib.gpumem_configure(os.fsencode(text)) != 0:
        why = lib.gpumem_last_error()
        raise ValueError(
            "gpumem: "
            + (why.decode("utf-8", "replace") if why else 'configuration "%s" refused' % text)
        )
    return text


def device_stats(device=0):
    """`device`'s statistics as a dict with torch.cuda.memory_stats()'s key
    names: ``"<stat>.all.<current|peak|allocated|freed>"`` for allocation,
    segment, active, allocated_bytes, requested_bytes, reserved_bytes and
    active_bytes; num_alloc_retries, num_ooms, num_device_alloc,
    num_device_free; and ``largest_free_block`` (bytes of the largest request
    served now without growing; PyTorch's cacheInfo). A device not used yet
    reads zeros. Raises ValueError for a device out of range (0 to 63).
    """
    lib = _newer("gpumem_get_device_stats")
    raw = _abi.DeviceStats()
    if lib.gpumem_get_device_stats(device, ctypes.byref(raw)) != 0:
        raise ValueError("gpumem: device %d is out of range (0 to 63)" % device)
    stats = {}
    for name in _abi.STAT_FIELDS:
        stat = getattr(raw, name)
        for part, _ in _abi.Stat._fields_:
            stats["%s.all.%s" % (name, part)] = getattr(stat, part)
    for name in _abi.COUNTER_FIELDS:
        stats[name] = getattr(raw, name)
    return dict(sorted(stats.items()))


def last_error():
    """Why this thread's last allocation failed (a str: out of memory with the
    requested, reserved, live and largest free bytes, or another error), or
    None when it did not fail."""
    why = _newer("gpumem_last_error").gpumem_last_error()
    return None if why is None else why.decode("utf-8", "replace")


def _newer(name):
    """The library, which must have `name` (one of issue 16's functions)."""
    lib = library()
    if not hasattr(lib, name):
        raise RuntimeError(
            "gpumem: %s has no %s: it was built from an older gpumem; rebuild "
            "it (pip install ./python)" % (library_path(), name)
        )
    return lib


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


def mapping_changes(device=0):
    """Mappings the vpool serving `device` has made and unmapped since it
    was built (one per extent mapped or unmapped at one place; aliases
    included, which num_device_alloc does not count); None when `device` is
    served by another resource or not used yet (or by a library older than
    this count)."""
    lib = library()
    if not hasattr(lib, "gpumem_mapping_changes"):
        return None
    n = lib.gpumem_mapping_changes(device)
    return None if n < 0 else n


def bad_free_count(device=-1):
    """Frees gpumem refused on `device` (pointers it did not hand out, second
    frees, wrong sizes; each freed nothing); -1: all devices."""
    return library().gpumem_bad_free_count(device)


def config_error():
    """Why the configuration in force is invalid (a str), or None when it is
    valid. It is GPUMEM_CONF's until configure() replaces it; a refused
    configure() changes nothing, this included.

    The library reads GPUMEM_CONF once, at its first call: this call, if it
    is the first, so set GPUMEM_CONF before.
    """
    why = library().gpumem_config_error()
    return None if why is None else why.decode("utf-8", "replace")


def check_config():
    """Raises ValueError naming every problem when the configuration in force
    is invalid."""
    why = config_error()
    if why is not None:
        raise ValueError("gpumem: " + why)
