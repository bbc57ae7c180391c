"""Regions, sleep and wake from Python (gpumem.regions and the gpumem.torch
functions, which need no PyTorch when given a device): over a VirtualPool
(resource=vpool, in a child process) a region's allocations give their
memory back and come back at the same addresses; allocating in a region
asleep fails with the reason; every other resource refuses with
RegionError naming resource=vpool."""

import pytest

import gpumem
from gpumem import regions
from support import MIB, lib, newer, child_ok

REGION_ABI = (
    "gpumem_region_begin",
    "gpumem_region_end",
    "gpumem_sleep",
    "gpumem_wake",
    "gpumem_sleeping_bytes",
)


def test_names_map_to_tags_once_per_process():
    first = regions.tag("test-names-a")
    assert regions.tag("test-names-a") == first
    second = regions.tag("test-names-b")
    assert second != first and second >= 1
    assert regions.tag(7) == 7
    for bad in (0, -1, 1 << 32, "", None, 1.5, True):
        with pytest.raises(ValueError):
            regions.tag(bad)
    # Names and numbers never share a tag: sleeping one would sleep both.
    assert 7 not in (first, second)
    with pytest.raises(ValueError, match="test-names-a"):
        regions.tag(first)
    assert regions.tag(1) == 1
    assert regions.tag("test-names-c") not in (1, 7, first, second)


@newer(*REGION_ABI)
def test_regions_need_a_virtual_pool(device):
    # This process serves resource=pool.
    with pytest.raises(regions.RegionError, match="resource=vpool"):
        with regions.region("weights", device):
            pass
    with pytest.raises(regions.RegionError, match="resource=vpool"):
        regions.sleep("weights", device=device)
    assert regions.sleeping_bytes("weights", device) == 0
    # Nothing was begun: allocations carry no region.
    p = lib.gpumem_malloc(MIB, device, None)
    assert p
    lib.gpumem_free(p, MIB, device, None)


@newer(*REGION_ABI)
def test_a_region_sleeps_and_wakes_over_a_virtual_pool():
    child_ok(
        "import gpumem, gpumem.torch\n"
        "from gpumem import regions\n"
        "lib = gpumem.library()\n"
        "MIB = 1 << 20\n"
        "with regions.region('weights', 0) as tag:\n"
        "    assert tag == regions.tag('weights') == 2**32 - 1\n"
        "    w = [lib.gpumem_malloc(n * MIB, 0, None) for n in (8, 16)]\n"
        "    with gpumem.torch.region('kv', device=0):\n"
        "        kv = lib.gpumem_malloc(32 * MIB, 0, None)\n"
        "other = lib.gpumem_malloc(4 * MIB, 0, None)\n"
        "assert all(w) and kv and other\n"
        "held = gpumem.reserved_bytes(0)\n"
        "regions.sleep('weights', backup=True, device=0)\n"
        "assert regions.sleeping_bytes('weights', 0) == 24 * MIB\n"
        "assert gpumem.reserved_bytes(0) <= held - 16 * MIB, (held, gpumem.reserved_bytes(0))\n"
        "try:\n"
        "    regions.sleep('weights', device=0)\n"
        "    raise AssertionError('slept twice')\n"
        "except regions.RegionError as e:\n"
        "    assert 'already asleep' in str(e), e\n"
        "with regions.region('weights', 0):\n"
        "    assert not lib.gpumem_malloc(MIB, 0, None)\n"
        "    assert 'asleep' in gpumem.last_error(), gpumem.last_error()\n"
        "gpumem.torch.sleep('kv', backup=False, device=0)\n"
        "assert gpumem.torch.sleeping_bytes('kv', device=0) == 32 * MIB\n"
        "lib.gpumem_free(w[0], 8 * MIB, 0, None)  # freeing a sleeping block is fine\n"
        "assert regions.sleeping_bytes('weights', 0) == 16 * MIB\n"
        "assert gpumem.bad_free_count(0) == 0\n"
        "regions.wake('weights', 0)\n"
        "gpumem.torch.wake('kv', device=0)\n"
        "assert regions.sleeping_bytes('weights', 0) == 0\n"
        "try:\n"
        "    regions.wake('kv', 0)\n"
        "    raise AssertionError('woke twice')\n"
        "except regions.RegionError as e:\n"
        "    assert 'not asleep' in str(e), e\n"
        "for p, n in ((w[1], 16), (kv, 32), (other, 4)):\n"
        "    lib.gpumem_free(p, n * MIB, 0, None)\n"
        "assert gpumem.allocated_bytes(0) == 0\n"
        "print('child ok')\n",
        conf="resource=vpool",
    )
