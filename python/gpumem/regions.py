"""Regions of gpumem's VirtualPool: put a group of allocations (a model's
weights, a KV cache) to sleep, giving their GPU memory back to the driver,
and wake them at the same addresses, with their contents or without.

Needs ``resource=vpool`` (``configure(resource="vpool")`` or
``GPUMEM_CONF``)::

    from gpumem import regions
    with regions.region("weights"):
        ...                               # allocations here carry the region
    regions.sleep("weights", backup=True)  # contents to pinned host memory
    regions.wake("weights")                # same addresses, same contents

A region is named by a string or by a tag, a number from 1 up. Each name gets
a tag of its own the first time it is used in this process, counting down
from 2**32 - 1 (``tag()`` says which), so every part of a program that says
"weights" means one region, and no name shares a tag with a region numbered
directly.
Names are this process's; the region is the device's: while it is begun,
every allocation on the device, from any thread, carries it. Regions nest.

``sleep`` waits for all work on the device, copies the region's blocks to
pinned host memory when ``backup`` (else their contents are lost: after
``wake`` they are undefined), and gives back the physical memory under them;
their addresses stay reserved for them, so pointers (and CUDA graphs) that
use them work again after ``wake``. While a region sleeps, freeing its
allocations is fine, allocating in it fails, and kernels must not touch it.
A failure leaves the region as it was. ``gpumem.torch`` has the same
functions with PyTorch's current device as the default.
"""

import contextlib

from . import _abi, _newer

__all__ = ["RegionError", "tag", "region", "begin", "end", "sleep", "wake", "sleeping_bytes"]

_tags = {}
_numbered = set()
_TOP = (1 << 32) - 1


class RegionError(RuntimeError):
    """A region call failed; the message says why (with the library's reason)."""


def tag(name):
    """The tag of region `name`: an int from 1 up is its own tag; a str gets
    a tag of its own at its first use in this process, the highest free one
    (from 2**32 - 1 down). Raises ValueError for anything else, and for a
    number that is already a name's tag."""
    if isinstance(name, bool) or not isinstance(name, (int, str)):
        raise ValueError("gpumem: a region is named by a str or an int tag, not %r" % (name,))
    if isinstance(name, int):
        if not 1 <= name <= _TOP:
            raise ValueError("gpumem: region tag %d: tags are 1 to 2**32 - 1" % name)
        for named, t in _tags.items():
            if t == name:
                raise ValueError(
                    "gpumem: region tag %d is region %r's; use the name" % (name, named)
                )
        _numbered.add(name)
        return name
    if not name:
        raise ValueError("gpumem: a region's name cannot be empty")
    if name not in _tags:
        used = set(_tags.values()) | _numbered
        t = _TOP
        while t in used:
            t -= 1
        _tags[name] = t
    return _tags[name]


def _call(fn, what, name, *args):
    lib = _newer(fn)
    rc = getattr(lib, fn)(*args)
    if rc != 0:
        why = lib.gpumem_last_error()
        why = why.decode("utf-8", "replace") if why else "%s failed (%d)" % (fn, rc)
        if rc == _abi.NOT_A_VIRTUAL_POOL:
            why += ' (configure gpumem with resource="vpool")'
        raise RegionError("gpumem: %s of region %r: %s" % (what, name, why))


def begin(name, device=0):
    """Begins region `name` on `device`: allocations there carry it until
    ``end``."""
    _call("gpumem_region_begin", "begin", name, device, tag(name))


def end(device=0):
    """Ends the region begun last on `device`."""
    _call("gpumem_region_end", "end", None, device)


@contextlib.contextmanager
def region(name, device=0):
    """Allocations on `device` inside the ``with`` block carry region
    `name`."""
    begin(name, device)
    try:
        yield tag(name)
    finally:
        end(device)


def sleep(name, backup=True, device=0):
    """Puts region `name` of `device` to sleep (see the module's
    documentation); its contents go to pinned host memory first when
    `backup`. Raises RegionError (the region as it was) on failure."""
    _call("gpumem_sleep", "sleep", name, device, tag(name), 1 if backup else 0)


def wake(name, device=0):
    """Wakes region `name` of `device`: its memory back at the same
    addresses, with its contents if it slept with a backup. Raises
    RegionError (the region still asleep) on failure."""
    _call("gpumem_wake", "wake", name, device, tag(name))


def sleeping_bytes(name, device=0):
    """Bytes of region `name`'s allocations asleep on `device` (0 while it
    is awake)."""
    return _newer("gpumem_sleeping_bytes").gpumem_sleeping_bytes(device, tag(name))
