"""The rest of the C ABI the native PyTorch allocator calls: the memory
fraction, record_stream and the snapshot."""

import ctypes
import math

import gpumem
from gpumem import _abi
from support import MIB, lib, newer, child_ok


@newer("gpumem_set_memory_fraction", "gpumem_get_memory_fraction")
def test_memory_fraction_refuses_bad_values(device):
    assert lib.gpumem_get_memory_fraction(device) == 1.0
    for bad in (-0.5, 1.5, math.nan, math.inf):
        assert lib.gpumem_set_memory_fraction(device, bad) == -1, bad
    assert lib.gpumem_set_memory_fraction(64, 0.5) == -1
    assert lib.gpumem_get_memory_fraction(device) == 1.0
    # PyTorch's whole range, 0 included.
    try:
        for good in (0.0, 0.25, 1.0):
            assert lib.gpumem_set_memory_fraction(device, good) == 0, good
            assert lib.gpumem_get_memory_fraction(device) == good
    finally:
        assert lib.gpumem_set_memory_fraction(device, 1.0) == 0


@newer("gpumem_set_memory_fraction", "gpumem_get_memory_fraction", "gpumem_get_device_stats")
def test_memory_fraction_caps_what_the_device_holds():
    # 1 GiB blocks until out of memory, under a quarter and then half of the
    # device: the second run gets twice as many. No max_size here.
    r = child_ok(
        "import gpumem\n"
        "lib = gpumem.library()\n"
        "GIB = 1 << 30\n"
        "def fill(fraction):\n"
        "    assert lib.gpumem_set_memory_fraction(0, fraction) == 0\n"
        "    assert lib.gpumem_get_memory_fraction(0) == fraction\n"
        "    ptrs = []\n"
        "    while len(ptrs) < 1000:\n"
        "        p = lib.gpumem_malloc(GIB, 0, None)\n"
        "        if not p:\n"
        "            break\n"
        "        ptrs.append(p)\n"
        "    assert 'out of memory' in gpumem.last_error().lower(), gpumem.last_error()\n"
        "    held = gpumem.reserved_bytes(0)\n"
        "    for p in ptrs:\n"
        "        lib.gpumem_free(p, GIB, 0, None)\n"
        "    gpumem.empty_cache(0)\n"
        "    return len(ptrs), held\n"
        "quarter, held_quarter = fill(0.25)\n"
        "half, held_half = fill(0.5)\n"
        "assert quarter >= 1 and abs(half - 2 * quarter) <= 2, (quarter, half)\n"
        "assert held_half <= 2 * held_quarter + 2 * GIB, (held_quarter, held_half)\n"
        "assert gpumem.device_stats(0)['num_ooms'] == 2\n"
        "print('child ok', quarter, half)\n",
        conf="resource=pool",
    )
    assert "child ok" in r.stdout


@newer("gpumem_record_stream")
def test_record_stream_then_free(device):
    p = lib.gpumem_malloc(MIB, device, None)
    assert p
    lib.gpumem_record_stream(p, device, 1)  # also used on another stream
    lib.gpumem_free(p, MIB, device, None)
    assert gpumem.allocated_bytes(device) == 0
    gpumem.empty_cache(device)  # waits for the other stream's work
    assert gpumem.reserved_bytes(device) == 0


@newer("gpumem_record_stream")
def test_record_stream_of_an_unknown_pointer_changes_nothing(device):
    p = lib.gpumem_malloc(MIB, device, None)
    lib.gpumem_record_stream(p + 4096, device, 1)  # inside a block
    lib.gpumem_record_stream(0xDEAD_0000, device, 1)
    lib.gpumem_record_stream(None, device, 1)
    assert gpumem.allocated_bytes(device) == MIB
    lib.gpumem_free(p, MIB, device, None)


def _snapshot(device, max_segments, max_blocks):
    segments = (_abi.Segment * max_segments)()
    blocks = (_abi.Block * max_blocks)()
    n_segments, n_blocks = ctypes.c_size_t(), ctypes.c_size_t()
    rc = lib.gpumem_snapshot(device, segments, max_segments, ctypes.byref(n_segments),
                             blocks, max_blocks, ctypes.byref(n_blocks))
    return rc, n_segments.value, n_blocks.value, segments, blocks


@newer("gpumem_snapshot")
def test_snapshot_lists_segments_and_live_blocks(device):
    sizes = [1000, MIB, 3 * MIB + 5]
    ptrs = [lib.gpumem_malloc(n, device, None) for n in sizes]
    assert all(ptrs)

    rc, n_segments, n_blocks, _, _ = _snapshot(device, 0, 0)
    assert rc == 0 and n_segments >= 1 and n_blocks == 3

    rc, n_segments, n_blocks, segments, blocks = _snapshot(device, n_segments, n_blocks)
    assert rc == 0
    segs = [(s.address, s.size) for s in segments]
    assert segs == sorted(segs)
    for (a, n), (b, _) in zip(segs, segs[1:]):
        assert a + n <= b, "segments do not overlap"
    assert sum(n for _, n in segs) == gpumem.reserved_bytes(device)

    assert [b.address for b in blocks] == sorted(ptrs)
    by_ptr = dict(zip(ptrs, sizes))
    for b in blocks:
        # Resources that keep no requested size (pool, vpool) report the block's.
        assert by_ptr[b.address] <= b.requested <= b.size
        assert b.size >= b.requested
        assert any(a <= b.address and b.address + b.size <= a + n for a, n in segs), hex(b.address)
    assert sum(b.size for b in blocks) == gpumem.allocated_bytes(device)

    # Arrays too small: the totals still come back.
    rc, n_segments_again, n_blocks, _, blocks = _snapshot(device, 1, 1)
    assert rc == 0 and n_blocks == 3 and n_segments_again == n_segments
    assert blocks[0].address == min(ptrs)

    for p, n in zip(ptrs, sizes):
        lib.gpumem_free(p, n, device, None)
    assert _snapshot(device, 4, 4)[2] == 0
    assert _snapshot(64, 1, 1)[0] == -1
