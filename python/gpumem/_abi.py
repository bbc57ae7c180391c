"""The C ABI of libgpumem.so as ctypes sees it: structures and signatures,
as crates/gpumem-capi/include/gpumem.h declares them.

A library built before issue 16's functions lacks them: ``declare`` sets the
types of those that are there, and callers test for one with
``hasattr(lib, name)``.
"""

import ctypes

_vp, _ssz, _sz, _i = ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_size_t, ctypes.c_int
_i64, _u64, _u32 = ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint32


class Stat(ctypes.Structure):
    """gpumem_stat_t: one statistic as PyTorch keeps it."""

    _fields_ = [("current", _i64), ("peak", _i64), ("allocated", _i64), ("freed", _i64)]


# The Stat fields of gpumem_device_stats_t, by PyTorch's name for them.
STAT_FIELDS = [
    "allocation",
    "segment",
    "active",
    "allocated_bytes",
    "requested_bytes",
    "reserved_bytes",
    "active_bytes",
]
# Its plain counters, named as torch.cuda.memory_stats names them, except
# largest_free_block (what PyTorch's cacheInfo reports), which has no key there.
COUNTER_FIELDS = [
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
    "largest_free_block",
]


class DeviceStats(ctypes.Structure):
    """gpumem_device_stats_t: a device's statistics."""

    _fields_ = [(name, Stat) for name in STAT_FIELDS] + [(name, _i64) for name in COUNTER_FIELDS]


class Segment(ctypes.Structure):
    """gpumem_segment_t: memory held from the driver."""

    _fields_ = [
        ("address", _u64),
        ("size", _u64),
        ("stream", _u64),
        ("pool_id0", _u64),
        ("pool_id1", _u64),
        ("is_large", ctypes.c_int32),
        ("is_expandable", ctypes.c_int32),
    ]


class Block(ctypes.Structure):
    """gpumem_block_t: a live allocation."""

    _fields_ = [("address", _u64), ("size", _u64), ("requested", _u64), ("stream", _u64)]


# name: (result type, argument types). Every library this package loads has these.
SIGNATURES = {
    "gpumem_malloc": (_vp, [_ssz, _i, _vp]),
    "gpumem_free": (None, [_vp, _ssz, _i, _vp]),
    "gpumem_cupy_malloc": (_vp, [_vp, _sz, _i]),
    "gpumem_cupy_free": (None, [_vp, _vp, _i]),
    "gpumem_allocated_bytes": (_sz, [_i]),
    "gpumem_peak_allocated_bytes": (_sz, [_i]),
    "gpumem_reserved_bytes": (_sz, [_i]),
    "gpumem_peak_reserved_bytes": (_sz, [_i]),
    "gpumem_reset_peak": (None, [_i]),
    "gpumem_empty_cache": (None, [_i]),
    "gpumem_bad_free_count": (_u64, [_i]),
    "gpumem_config_error": (ctypes.c_char_p, []),
}

# What the native PyTorch allocator calls (issue 16): absent from older builds.
NEWER_SIGNATURES = {
    "gpumem_configure": (_i, [ctypes.c_char_p]),
    "gpumem_last_error": (ctypes.c_char_p, []),
    "gpumem_get_device_stats": (_i, [_i, ctypes.POINTER(DeviceStats)]),
    "gpumem_reset_peak_stats": (None, [_i]),
    "gpumem_reset_accumulated_stats": (None, [_i]),
    "gpumem_set_memory_fraction": (_i, [_i, ctypes.c_double]),
    "gpumem_get_memory_fraction": (ctypes.c_double, [_i]),
    "gpumem_record_stream": (None, [_vp, _i, _vp]),
    "gpumem_snapshot": (
        _i,
        [
            _i,
            ctypes.POINTER(Segment),
            _sz,
            ctypes.POINTER(_sz),
            ctypes.POINTER(Block),
            _sz,
            ctypes.POINTER(_sz),
        ],
    ),
}


# Regions of a VirtualPool: sleep and wake (issue 20): absent from older builds.
NEWER_SIGNATURES.update(
    {
        "gpumem_region_begin": (_i, [_i, _u32]),
        "gpumem_region_end": (_i, [_i]),
        "gpumem_sleep": (_i, [_i, _u32, _i]),
        "gpumem_wake": (_i, [_i, _u32]),
        "gpumem_sleeping_bytes": (_sz, [_i, _u32]),
    }
)

# VirtualPool's mappings (issue 47): absent from older builds.
NEWER_SIGNATURES["gpumem_mapping_changes"] = (_i64, [_i])

# What gpumem_region_*, gpumem_sleep and gpumem_wake return when the device's
# resource is not a VirtualPool (resource=vpool).
NOT_A_VIRTUAL_POOL = -2


def declare(lib):
    """Sets the result and argument types of `lib`'s functions. Raises
    AttributeError when one of SIGNATURES is missing; skips the missing
    NEWER_SIGNATURES."""
    for name, (res, args) in SIGNATURES.items():
        _set(getattr(lib, name), res, args)
    for name, (res, args) in NEWER_SIGNATURES.items():
        if hasattr(lib, name):
            _set(getattr(lib, name), res, args)


def _set(f, res, args):
    f.restype = res
    f.argtypes = args
