"""libgpumem.so through ctypes, over the simulated device (no GPU needed).

Run with ``python3 python/tests/test_abi.py`` (prints "N passed, M failed")
or with pytest. The library comes from GPUMEM_LIB, else the usual places
(see gpumem.library_path). The configuration is read once per process, so
this process runs with ``resource=pool,max_size=64MiB``; other
configurations run in child processes.
"""

import ctypes
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # python/, for `import gpumem`

# Before the library's first call, which reads them.
os.environ["GPUMEM_DEVICE"] = "sim"
os.environ["GPUMEM_CONF"] = "resource=pool,max_size=64MiB"

import gpumem  # noqa: E402

MIB = 1 << 20
lib = gpumem.library()


def test_library_exports_the_abi():
    for name in [
        "gpumem_malloc",
        "gpumem_free",
        "gpumem_cupy_malloc",
        "gpumem_cupy_free",
        "gpumem_allocated_bytes",
        "gpumem_reserved_bytes",
        "gpumem_peak_reserved_bytes",
        "gpumem_reset_peak",
        "gpumem_empty_cache",
        "gpumem_bad_free_count",
        "gpumem_config_error",
        "gpumem_configure",
        "gpumem_last_error",
        "gpumem_get_device_stats",
        "gpumem_reset_peak_stats",
        "gpumem_reset_accumulated_stats",
        "gpumem_set_memory_fraction",
        "gpumem_get_memory_fraction",
        "gpumem_record_stream",
        "gpumem_snapshot",
    ]:
        assert getattr(lib, name), name
    assert os.path.basename(gpumem.library_path()) == "libgpumem.so"


def test_malloc_free_and_stats():
    d = 0
    assert gpumem.allocated_bytes(d) == 0
    p = lib.gpumem_malloc(MIB, d, None)
    assert p and p % 256 == 0
    assert gpumem.allocated_bytes(d) == MIB
    assert gpumem.reserved_bytes(d) >= MIB
    q = lib.gpumem_malloc(1000, d, None)
    assert gpumem.allocated_bytes(d) == MIB + 1024
    assert gpumem.peak_reserved_bytes(d) >= gpumem.reserved_bytes(d)
    lib.gpumem_free(p, MIB, d, None)
    lib.gpumem_free(q, 1000, d, None)
    assert gpumem.allocated_bytes(d) == 0
    assert gpumem.peak_allocated_bytes(d) == MIB + 1024
    gpumem.reset_peak(d)
    assert gpumem.peak_allocated_bytes(d) == 0
    assert gpumem.peak_reserved_bytes(d) == gpumem.reserved_bytes(d)


def test_out_of_memory_is_null():
    d = 1
    assert lib.gpumem_malloc(1 << 30, d, None) is None  # 1 GiB over 64 MiB
    p = lib.gpumem_malloc(48 * MIB, d, None)
    assert p
    assert lib.gpumem_malloc(32 * MIB, d, None) is None
    lib.gpumem_free(p, 48 * MIB, d, None)
    assert lib.gpumem_cupy_malloc(None, 1 << 50, d) is None
    assert gpumem.allocated_bytes(d) == 0


def test_empty_cache_lowers_reserved():
    d = 2
    ptrs = [lib.gpumem_malloc(3 * MIB, d, None) for _ in range(6)]
    assert all(ptrs)
    full = gpumem.reserved_bytes(d)
    assert full >= 18 * MIB
    for p in ptrs:
        lib.gpumem_free(p, 3 * MIB, d, None)
    assert gpumem.reserved_bytes(d) == full
    gpumem.empty_cache(d)
    assert gpumem.reserved_bytes(d) == 0
    assert gpumem.peak_reserved_bytes(d) == full


def test_zero_negative_null_and_foreign_streams():
    d = 3
    assert lib.gpumem_malloc(0, d, None) is None
    assert lib.gpumem_malloc(-1, d, None) is None
    assert lib.gpumem_malloc(256, -1, None) is None
    lib.gpumem_free(None, 0, d, None)
    for stream in [None, 1, 2, 0x7F00_0000]:
        p = lib.gpumem_malloc(4096, d, stream)
        assert p, stream
        lib.gpumem_free(p, 4096, d, stream)
        # Same stream handle again: the freed block comes straight back.
        again = lib.gpumem_malloc(4096, d, stream)
        assert again == p, (stream, hex(p), hex(again or 0))
        lib.gpumem_free(again, 4096, d, stream)
    assert gpumem.allocated_bytes(d) == 0


def test_cupy_entry_points():
    d = 4
    p = lib.gpumem_cupy_malloc(None, 5 * MIB, d)
    q = lib.gpumem_cupy_malloc(ctypes.c_void_p(1234), 10, d)
    assert p and q
    assert gpumem.allocated_bytes(d) == 5 * MIB + 256
    lib.gpumem_cupy_free(None, p, d)
    lib.gpumem_cupy_free(None, q, d)
    lib.gpumem_cupy_free(None, None, d)
    assert gpumem.allocated_bytes(d) == 0
    assert lib.gpumem_cupy_malloc(None, 0, d) is None


def _child(conf, code):
    env = dict(os.environ, GPUMEM_CONF=conf, GPUMEM_DEVICE="sim",
               GPUMEM_LIB=gpumem.library_path())
    return subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n" % os.path.dirname(HERE) + code],
        env=env, capture_output=True, text=True, timeout=120,
    )


def test_bad_conf_is_an_error_and_serves_nothing():
    r = _child(
        "resource=turbo,max_size=7OGiB,colour=red",
        "import gpumem, gpumem.torch, gpumem.cupy\n"
        "why = gpumem.config_error()\n"
        "assert why.startswith('GPUMEM_CONF=\"resource=turbo,max_size=7OGiB,colour=red\" is invalid: '), why\n"
        "for enable in (gpumem.check_config, gpumem.torch.enable, gpumem.cupy.enable):\n"
        "    try:\n"
        "        enable()\n"
        "    except ValueError as e:\n"
        "        assert 'unknown resource \"turbo\"' in str(e), e\n"
        "    else:\n"
        "        raise AssertionError(enable.__name__ + ' accepted a bad GPUMEM_CONF')\n"
        "lib = gpumem.library()\n"
        "assert lib.gpumem_malloc(1 << 20, 0, None) is None, 'nothing is served'\n"
        "print('child ok')\n",
    )
    assert r.returncode == 0, r.stderr
    assert "child ok" in r.stdout, (r.stdout, r.stderr)
    for needle in [
        'gpumem: GPUMEM_CONF="resource=turbo,max_size=7OGiB,colour=red" is invalid: ',
        'unknown resource "turbo" (expected one of pool, caching, binning, arena, async, vpool, cuda)',
        "max_size: ",
        'unknown key "colour"',
        "every allocation returns NULL until it is fixed",
        "allocation of 1048576 bytes refused",
    ]:
        assert needle in r.stderr, (needle, r.stderr)


def test_valid_conf_has_no_error():
    assert gpumem.config_error() is None
    gpumem.check_config()


def test_bad_frees_are_counted_and_free_nothing():
    d = 5
    assert gpumem.bad_free_count(d) == 0
    p = lib.gpumem_malloc(4096, d, None)
    q = lib.gpumem_malloc(4096, d, None)
    assert p and q
    lib.gpumem_free(p, 8192, d, None)  # wrong size
    lib.gpumem_free(p + 256, 256, d, None)  # inside a block
    assert gpumem.bad_free_count(d) == 2
    assert gpumem.allocated_bytes(d) == 8192, "nothing was freed"
    lib.gpumem_free(p, 4096, d, None)
    lib.gpumem_free(p, 4096, d, None)  # second free
    lib.gpumem_free(None, 4096, d, None)  # NULL: nothing, not counted
    assert gpumem.bad_free_count(d) == 3
    lib.gpumem_free(q, 4096, d, None)
    assert gpumem.allocated_bytes(d) == 0
    assert gpumem.bad_free_count(-1) >= 3


def test_other_resources_in_children():
    for conf in ["resource=caching,max_size=64MiB", "resource=binning,max_size=64MiB",
                 "resource=cuda,max_size=64MiB", "resource=async,max_size=64MiB",
                 "resource=arena,initial_size=64MiB", "resource=vpool,max_size=64MiB"]:
        r = _child(
            conf,
            "import gpumem\n"
            "lib = gpumem.library()\n"
            "p = lib.gpumem_malloc(1 << 20, 0, None)\n"
            "assert p\n"
            "assert lib.gpumem_malloc(1 << 30, 0, None) is None\n"
            "assert gpumem.reserved_bytes(0) >= 1 << 20\n"
            "lib.gpumem_free(p, 1 << 20, 0, None)\n"
            "gpumem.empty_cache(0)\n"
            "print('child ok', gpumem.reserved_bytes(0))\n",
        )
        assert r.returncode == 0 and "child ok" in r.stdout, (conf, r.stdout, r.stderr)
        assert "GPUMEM_CONF" not in r.stderr, (conf, r.stderr)
        assert "bad free" not in r.stderr, (conf, r.stderr)


class Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("current", "peak", "allocated", "freed")]


class DeviceStats(ctypes.Structure):
    _fields_ = [
        (n, Stat)
        for n in (
            "allocation",
            "segment",
            "active",
            "allocated_bytes",
            "requested_bytes",
            "reserved_bytes",
            "active_bytes",
        )
    ] + [
        (n, ctypes.c_int64)
        for n in (
            "num_alloc_retries",
            "num_ooms",
            "num_device_alloc",
            "num_device_free",
            "largest_free_block",
        )
    ]


def test_device_stats_and_last_error_from_the_shared_library():
    d = 7
    lib.gpumem_last_error.restype = ctypes.c_char_p
    lib.gpumem_get_device_stats.argtypes = [ctypes.c_int, ctypes.POINTER(DeviceStats)]
    p = lib.gpumem_malloc(3 * MIB, d, None)
    assert lib.gpumem_last_error() is None
    assert lib.gpumem_malloc(1 << 50, d, None) is None
    why = lib.gpumem_last_error().decode()
    assert "out of memory" in why and "requested 1125899906842624 bytes" in why, why
    s = DeviceStats()
    assert lib.gpumem_get_device_stats(d, ctypes.byref(s)) == 0
    assert s.allocation.current == 1 and s.allocated_bytes.current == 3 * MIB
    assert s.reserved_bytes.current == gpumem.reserved_bytes(d)
    assert (s.num_alloc_retries, s.num_ooms) == (1, 1)
    assert lib.gpumem_get_device_stats(64, ctypes.byref(s)) == -1
    lib.gpumem_free(p, 3 * MIB, d, None)


def test_helpers_explain_missing_frameworks():
    import importlib.util

    for mod, pkg in [("gpumem.torch", "torch"), ("gpumem.cupy", "cupy")]:
        m = __import__(mod, fromlist=["enable"])
        if importlib.util.find_spec(pkg) is not None:
            continue  # installed: enable() would really switch allocators
        try:
            m.enable()
        except ImportError as e:
            assert pkg in str(e)
        else:
            raise AssertionError(mod + ".enable() without " + pkg)


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    passed = failed = 0
    for name, f in tests:
        try:
            f()
        except Exception as e:  # noqa: BLE001 - report every failure
            failed += 1
            print("FAIL %s: %s: %s" % (name, type(e).__name__, e))
        else:
            passed += 1
            print("ok   %s" % name)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
