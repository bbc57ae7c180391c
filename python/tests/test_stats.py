"""gpumem.device_stats() (torch.cuda.memory_stats's names), its resets,
gpumem.last_error() and the out-of-memory counters, through the C ABI."""

import threading

import pytest

import gpumem
from support import GIB, MIB, lib, newer

STATS = ["allocation", "segment", "active", "allocated_bytes", "requested_bytes",
         "reserved_bytes", "active_bytes"]
PARTS = ["current", "peak", "allocated", "freed"]
COUNTERS = ["num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
            "largest_free_block"]

stats_abi = newer("gpumem_get_device_stats", "gpumem_reset_peak_stats",
                  "gpumem_reset_accumulated_stats")


@stats_abi
def test_keys_are_pytorchs(device):
    keys = set(gpumem.device_stats(device))
    assert keys == {"%s.all.%s" % (s, p) for s in STATS for p in PARTS} | set(COUNTERS)
    # What torch.cuda.memory_allocated, max_memory_reserved & co. read.
    for key in ["allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "reserved_bytes.all.peak",
                "active_bytes.all.current", "requested_bytes.all.current",
                "num_alloc_retries", "num_ooms"]:
        assert key in keys, key


@stats_abi
def test_a_device_not_used_reads_zeros_and_bad_devices_are_refused():
    assert set(gpumem.device_stats(63).values()) == {0}
    for bad in (64, -1):
        with pytest.raises(ValueError, match="device %d is out of range" % bad):
            gpumem.device_stats(bad)


@stats_abi
def test_stats_agree_with_allocated_and_reserved_bytes(device):
    sizes = [MIB, 1000, 5000]
    ptrs = [lib.gpumem_malloc(n, device, None) for n in sizes]
    assert all(ptrs)
    s = gpumem.device_stats(device)
    assert s["allocated_bytes.all.current"] == gpumem.allocated_bytes(device)
    assert s["allocated_bytes.all.peak"] == gpumem.peak_allocated_bytes(device)
    assert s["reserved_bytes.all.current"] == gpumem.reserved_bytes(device)
    assert s["reserved_bytes.all.peak"] == gpumem.peak_reserved_bytes(device)
    assert s["allocation.all.current"] == s["allocation.all.allocated"] == 3
    assert s["requested_bytes.all.current"] == sum(sizes)
    assert s["allocated_bytes.all.current"] >= s["requested_bytes.all.current"]
    assert s["active.all.current"] >= 3
    assert s["active_bytes.all.current"] >= s["allocated_bytes.all.current"]
    assert s["segment.all.current"] >= 1
    assert s["num_device_alloc"] >= 1
    assert 0 <= s["largest_free_block"] <= s["reserved_bytes.all.current"]

    lib.gpumem_free(ptrs[0], MIB, device, None)
    s = gpumem.device_stats(device)
    assert s["allocation.all.current"] == 2
    assert s["allocation.all.freed"] == 1
    assert s["allocated_bytes.all.freed"] == MIB
    assert s["requested_bytes.all.current"] == 6000
    # The freed MiB is cached: servable now without growing.
    assert s["largest_free_block"] >= MIB
    assert s["reserved_bytes.all.current"] == gpumem.reserved_bytes(device)

    for p, n in zip(ptrs[1:], sizes[1:]):
        lib.gpumem_free(p, n, device, None)
    s = gpumem.device_stats(device)
    assert s["allocation.all.current"] == 0
    assert s["allocated_bytes.all.current"] == 0
    assert s["allocation.all.peak"] == 3
    assert s["allocated_bytes.all.allocated"] == s["allocated_bytes.all.freed"]

    gpumem.empty_cache(device)
    s = gpumem.device_stats(device)
    assert s["reserved_bytes.all.current"] == 0
    assert s["segment.all.current"] == 0
    assert s["num_device_free"] >= 1
    assert s["largest_free_block"] == 0


@stats_abi
def test_reset_peak_and_accumulated(device):
    p = lib.gpumem_malloc(2 * MIB, device, None)
    q = lib.gpumem_malloc(MIB, device, None)
    lib.gpumem_free(p, 2 * MIB, device, None)
    lib.gpumem_reset_peak_stats(device)
    s = gpumem.device_stats(device)
    for stat in STATS:
        assert s[stat + ".all.peak"] == s[stat + ".all.current"], stat
    assert s["allocation.all.allocated"] == 2

    lib.gpumem_reset_accumulated_stats(device)
    s = gpumem.device_stats(device)
    for stat in STATS:
        assert s[stat + ".all.allocated"] == s[stat + ".all.freed"] == 0, stat
    for counter in ["num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"]:
        assert s[counter] == 0, counter
    assert s["allocation.all.current"] == 1, "current values stay"
    lib.gpumem_free(q, MIB, device, None)
    assert gpumem.device_stats(device)["allocation.all.freed"] == 1


@newer("gpumem_last_error", "gpumem_get_device_stats")
def test_an_impossible_request_fails_with_a_reason_for_its_thread(device):
    before = gpumem.device_stats(device)
    assert lib.gpumem_malloc(1 << 50, device, None) is None
    why = gpumem.last_error()
    assert isinstance(why, str) and str(1 << 50) in why, why
    after = gpumem.device_stats(device)
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["num_alloc_retries"] <= before["num_alloc_retries"] + 1

    seen = []
    other = threading.Thread(target=lambda: seen.append(gpumem.last_error()))
    other.start()
    other.join()
    assert seen == [None], "the reason belongs to the thread that failed"

    p = lib.gpumem_malloc(MIB, device, None)
    assert p, "the process goes on"
    assert gpumem.last_error() is None
    lib.gpumem_free(p, MIB, device, None)


@newer("gpumem_get_device_stats")
def test_cached_memory_makes_way_for_a_request_that_needs_it(device):
    # 32 MiB cached; 48 MiB more would pass max_size=64MiB unless the cache
    # goes back to the driver first (inside the pool, or by the C ABI's
    # retry).
    p = lib.gpumem_malloc(32 * MIB, device, None)
    lib.gpumem_free(p, 32 * MIB, device, None)
    assert gpumem.reserved_bytes(device) >= 32 * MIB
    q = lib.gpumem_malloc(48 * MIB, device, None)
    assert q
    s = gpumem.device_stats(device)
    assert s["num_alloc_retries"] <= 1
    assert s["num_ooms"] == 0
    lib.gpumem_free(q, 48 * MIB, device, None)
    assert lib.gpumem_malloc(GIB, device, None) is None
    s = gpumem.device_stats(device)
    assert s["num_ooms"] == 1
    assert s["num_alloc_retries"] <= 2, "one retry per failed allocation at most"
