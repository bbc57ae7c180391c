"""libgpumem.so's allocation and statistics functions through ctypes."""

import ctypes
import importlib.util

import pytest

import gpumem
from support import GIB, MIB, lib, newer, sim_only, child, child_ok

BASE_ABI = [
    "gpumem_malloc",
    "gpumem_free",
    "gpumem_cupy_malloc",
    "gpumem_cupy_free",
    "gpumem_allocated_bytes",
    "gpumem_peak_allocated_bytes",
    "gpumem_reserved_bytes",
    "gpumem_peak_reserved_bytes",
    "gpumem_reset_peak",
    "gpumem_empty_cache",
    "gpumem_bad_free_count",
    "gpumem_config_error",
]
ISSUE16_ABI = [
    "gpumem_configure",
    "gpumem_last_error",
    "gpumem_get_device_stats",
    "gpumem_reset_peak_stats",
    "gpumem_reset_accumulated_stats",
    "gpumem_set_memory_fraction",
    "gpumem_get_memory_fraction",
    "gpumem_record_stream",
    "gpumem_snapshot",
]


def test_library_exports_the_abi():
    for name in BASE_ABI:
        assert hasattr(lib, name), name
    assert gpumem.library_path().endswith("/libgpumem.so")


@newer(*ISSUE16_ABI)
def test_library_exports_the_native_allocators_abi():
    for name in ISSUE16_ABI:
        assert hasattr(lib, name), name


def test_malloc_free_and_stats(device):
    p = lib.gpumem_malloc(MIB, device, None)
    assert p and p % 256 == 0
    assert gpumem.allocated_bytes(device) == MIB
    assert gpumem.reserved_bytes(device) >= MIB
    q = lib.gpumem_malloc(1000, device, None)
    assert gpumem.allocated_bytes(device) == MIB + 1024
    assert gpumem.peak_reserved_bytes(device) >= gpumem.reserved_bytes(device)
    lib.gpumem_free(p, MIB, device, None)
    lib.gpumem_free(q, 1000, device, None)
    assert gpumem.allocated_bytes(device) == 0
    assert gpumem.peak_allocated_bytes(device) == MIB + 1024
    gpumem.reset_peak(device)
    assert gpumem.peak_allocated_bytes(device) == 0
    assert gpumem.peak_reserved_bytes(device) == gpumem.reserved_bytes(device)


def test_out_of_memory_is_null(device):
    assert lib.gpumem_malloc(GIB, device, None) is None  # over max_size=64MiB
    p = lib.gpumem_malloc(48 * MIB, device, None)
    assert p
    assert lib.gpumem_malloc(32 * MIB, device, None) is None
    lib.gpumem_free(p, 48 * MIB, device, None)
    assert lib.gpumem_cupy_malloc(None, 1 << 50, device) is None
    assert gpumem.allocated_bytes(device) == 0


def test_empty_cache_lowers_reserved(device):
    ptrs = [lib.gpumem_malloc(3 * MIB, device, None) for _ in range(6)]
    assert all(ptrs)
    full = gpumem.reserved_bytes(device)
    assert full >= 18 * MIB
    for p in ptrs:
        lib.gpumem_free(p, 3 * MIB, device, None)
    assert gpumem.reserved_bytes(device) == full
    gpumem.empty_cache(device)
    assert gpumem.reserved_bytes(device) == 0
    assert gpumem.peak_reserved_bytes(device) == full


@pytest.mark.parametrize("size", [0, -1])
def test_empty_and_negative_requests_are_null(device, size):
    assert lib.gpumem_malloc(size, device, None) is None
    assert lib.gpumem_malloc(256, -1, None) is None
    lib.gpumem_free(None, 0, device, None)  # NULL: nothing


@sim_only
@pytest.mark.parametrize("stream", [None, 1, 2, 0x7F00_0000])
def test_a_freed_block_comes_back_on_its_stream(device, stream):
    p = lib.gpumem_malloc(4096, device, stream)
    assert p
    lib.gpumem_free(p, 4096, device, stream)
    again = lib.gpumem_malloc(4096, device, stream)
    assert again == p, (hex(p), hex(again or 0))
    lib.gpumem_free(again, 4096, device, stream)


def test_cupy_entry_points(device):
    p = lib.gpumem_cupy_malloc(None, 5 * MIB, device)
    q = lib.gpumem_cupy_malloc(ctypes.c_void_p(1234), 10, device)
    assert p and q
    assert gpumem.allocated_bytes(device) == 5 * MIB + 256
    lib.gpumem_cupy_free(None, p, device)
    lib.gpumem_cupy_free(None, q, device)
    lib.gpumem_cupy_free(None, None, device)
    assert gpumem.allocated_bytes(device) == 0
    assert lib.gpumem_cupy_malloc(None, 0, device) is None


def test_bad_frees_are_counted_and_free_nothing(device):
    before = gpumem.bad_free_count(device)
    p = lib.gpumem_malloc(4096, device, None)
    q = lib.gpumem_malloc(4096, device, None)
    assert p and q
    lib.gpumem_free(p, 8192, device, None)  # wrong size
    lib.gpumem_free(p + 256, 256, device, None)  # inside a block
    assert gpumem.bad_free_count(device) == before + 2
    assert gpumem.allocated_bytes(device) == 8192, "nothing was freed"
    lib.gpumem_free(p, 4096, device, None)
    lib.gpumem_free(p, 4096, device, None)  # second free
    lib.gpumem_free(None, 4096, device, None)  # NULL: nothing, not counted
    assert gpumem.bad_free_count(device) == before + 3
    lib.gpumem_free(q, 4096, device, None)
    assert gpumem.bad_free_count(-1) >= before + 3


def test_valid_conf_has_no_error():
    assert gpumem.config_error() is None
    gpumem.check_config()


def test_bad_conf_is_an_error_and_serves_nothing():
    r = child(
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
        "assert gpumem.library().gpumem_malloc(1 << 20, 0, None) is None, 'nothing is served'\n"
        "print('child ok')\n",
        conf="resource=turbo,max_size=7OGiB,colour=red",
    )
    assert r.returncode == 0 and "child ok" in r.stdout, (r.stdout, r.stderr)
    for needle in [
        'gpumem: GPUMEM_CONF="resource=turbo,max_size=7OGiB,colour=red" is invalid: ',
        'unknown resource "turbo" (expected one of pool, caching, binning, arena, async, vpool, cuda)',
        "max_size: ",
        'unknown key "colour"',
        "every allocation returns NULL until it is fixed",
        "allocation of 1048576 bytes refused",
    ]:
        assert needle in r.stderr, (needle, r.stderr)


@pytest.mark.parametrize(
    "conf",
    [
        "resource=caching,max_size=64MiB",
        "resource=binning,max_size=64MiB",
        "resource=cuda,max_size=64MiB",
        "resource=async,max_size=64MiB",
        "resource=arena,initial_size=64MiB",
        "resource=vpool,max_size=64MiB",
    ],
)
def test_other_resources_in_children(conf):
    r = child_ok(
        "import gpumem\n"
        "lib = gpumem.library()\n"
        "p = lib.gpumem_malloc(1 << 20, 0, None)\n"
        "assert p\n"
        "assert lib.gpumem_malloc(1 << 30, 0, None) is None\n"
        "assert gpumem.reserved_bytes(0) >= 1 << 20\n"
        "lib.gpumem_free(p, 1 << 20, 0, None)\n"
        "gpumem.empty_cache(0)\n"
        "print('child ok', gpumem.reserved_bytes(0))\n",
        conf=conf,
    )
    assert "GPUMEM_CONF" not in r.stderr
    assert "bad free" not in r.stderr


@pytest.mark.parametrize("module, framework", [("gpumem.torch", "torch"), ("gpumem.cupy", "cupy")])
def test_helpers_explain_missing_frameworks(module, framework):
    if importlib.util.find_spec(framework) is not None:
        pytest.skip(framework + " is installed: enable() would really switch allocators")
    m = __import__(module, fromlist=["enable"])
    with pytest.raises(ImportError, match=framework):
        m.enable()


@newer("gpumem_mapping_changes")
def test_mapping_changes_count_vpool_mappings_only():
    # vpool: a 64 MiB block maps memory, empty_cache unmaps it again; the
    # default pool maps through no VirtualPool and answers None.
    code = (
        "import gpumem\n"
        "lib = gpumem.library()\n"
        "assert gpumem.mapping_changes(0) is None\n"
        "p = lib.gpumem_malloc(64 << 20, 0, None)\n"
        "made = gpumem.mapping_changes(0)\n"
        "lib.gpumem_free(p, 64 << 20, 0, None)\n"
        "gpumem.empty_cache(0)\n"
        "print('counts', made, gpumem.mapping_changes(0))\n"
        "print('child ok')\n"
    )
    r = child_ok(code, "resource=vpool")
    made, after = map(int, r.stdout.split("counts ")[1].split()[:2])
    assert made > 0 and after == 2 * made
    r = child_ok(code, "resource=pool")
    assert "counts None None" in r.stdout
