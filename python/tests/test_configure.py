"""gpumem.configure(**settings): GPUMEM_CONF's keys as keyword arguments."""

import importlib.util
import os

import pytest

import gpumem
import gpumem.cupy
import support
from support import CONF, MIB, child, child_ok, newer


def test_conf_text_joins_the_settings():
    assert gpumem.conf_text() == ""
    assert (
        gpumem.conf_text(resource="vpool", max_size=40 << 30, initial_size="1GiB")
        == "resource=vpool,max_size=42949672960,initial_size=1GiB"
    )
    assert gpumem.conf_text(max_size="none", log=None) == "max_size=none"
    assert gpumem.conf_text(log=os.path.join("/tmp", "job.csv")) == "log=/tmp/job.csv"
    assert set(gpumem.SETTINGS) == {
        "resource", "initial_size", "max_size", "release_threshold", "min_bin", "max_bin",
        "shards", "spread", "expandable", "recycle", "nccl_ready", "log",
    }
    assert gpumem.conf_text(resource="vpool", nccl_ready=True) == "resource=vpool,nccl_ready=true"
    assert gpumem.conf_text(expandable=False) == "expandable=false"
    assert gpumem.conf_text(recycle=True) == "recycle=true"
    assert gpumem.conf_text(resource="pool", shards=0) == "resource=pool,shards=0"
    assert gpumem.conf_text(resource="pool", spread="always") == "resource=pool,spread=always"


def test_a_misspelt_key_is_caught_before_the_library_loads():
    r = child_ok(
        "import gpumem\n"
        "try:\n"
        "    gpumem.configure(resource='pool', max_sise='1GiB')\n"
        "except ValueError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise AssertionError('a misspelt key was accepted')\n"
        "assert gpumem._lib is None, 'the library was loaded'\n"
        "print('child ok')\n"
    )
    assert 'unknown setting "max_sise" (did you mean "max_size"?)' in r.stdout
    assert (
        "resource, initial_size, max_size, release_threshold, min_bin, max_bin, shards, spread, expandable, recycle, nccl_ready, log"
        in r.stdout
    )


@pytest.mark.parametrize(
    "settings, why",
    [
        ({"max_size": True}, "expected bytes as an int"),
        ({"max_size": 1.5}, "expected bytes as an int"),
        ({"initial_size": -1}, "cannot be negative"),
        ({"log": "a,b.csv"}, "cannot hold one"),
        ({"resource": "vpool\0x"}, "NUL character"),
        ({"log": "job\0.csv"}, "NUL character"),
        ({"resource": ["pool"]}, "expected bytes as an int"),
        ({"colour": "red"}, 'unknown setting "colour"'),
    ],
)
def test_values_python_can_check_are_refused_before_the_library(settings, why):
    with pytest.raises(ValueError, match=why):
        gpumem.configure(**settings)


@newer("gpumem_configure")
def test_settings_take_effect():
    child_ok(
        "import gpumem\n"
        "assert gpumem.configure(resource='cuda', max_size=8 << 20) == 'resource=cuda,max_size=8388608'\n"
        "lib = gpumem.library()\n"
        "assert lib.gpumem_malloc(16 << 20, 0, None) is None, 'max_size'\n"
        "p = lib.gpumem_malloc(1 << 20, 0, None)\n"
        "assert p\n"
        "lib.gpumem_free(p, 1 << 20, 0, None)\n"
        "assert gpumem.reserved_bytes(0) == 0, 'resource=cuda caches nothing'\n"
        "print('child ok')\n",
        conf="resource=pool",
    )


@newer("gpumem_configure")
def test_configure_overrides_an_invalid_gpumem_conf():
    child_ok(
        "import gpumem\n"
        "gpumem.configure(resource='pool', max_size='64MiB')\n"
        "lib = gpumem.library()\n"
        "p = lib.gpumem_malloc(1 << 20, 0, None)\n"
        "assert p, 'served'\n"
        "lib.gpumem_free(p, 1 << 20, 0, None)\n"
        "print('child ok')\n",
        conf="resource=turbo",
    )


@newer("gpumem_configure", "gpumem_config_error")
@pytest.mark.parametrize(
    "settings, why",
    [
        ({"resource": "turbo"}, 'unknown resource "turbo"'),
        ({"max_size": "7OGiB"}, "max_size"),
        ({"resource": "pool", "min_bin": "4KiB"}, "min_bin"),
        ({"resource": "pool", "spread": "sometimes"}, "expected contended or always"),
        ({"resource": "arena", "spread": "always"}, "only for pool, binning and vpool"),
        ({"recycle": True, "expandable": False}, "recycle needs expandable heaps"),
        ({"resource": "arena", "initial_size": 1}, "smaller than one superblock"),
    ],
)
def test_bad_values_raise_the_librarys_reason_and_change_nothing(settings, why):
    r = child_ok(
        "import gpumem\n"
        "try:\n"
        "    gpumem.configure(**%r)\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n"
        "else:\n"
        "    raise AssertionError('accepted')\n"
        "gpumem.configure(resource='pool', max_size='64MiB')\n"
        "lib = gpumem.library()\n"
        "p = lib.gpumem_malloc(1 << 20, 0, None)\n"
        "assert p\n"
        "lib.gpumem_free(p, 1 << 20, 0, None)\n"
        "print('child ok')\n" % (settings,)
    )
    refused = next(line for line in r.stdout.splitlines() if line.startswith("refused:"))
    assert refused.startswith("refused: gpumem: ") and why in refused, refused


@newer("gpumem_configure")
def test_after_first_use_only_the_configuration_in_force_is_accepted():
    r = child_ok(
        "import gpumem\n"
        "gpumem.configure(resource='pool', max_size='64MiB')\n"
        "lib = gpumem.library()\n"
        "p = lib.gpumem_malloc(1 << 20, 0, None)\n"
        "assert p\n"
        "gpumem.configure(resource='pool', max_size='64MiB')  # the same: accepted\n"
        "try:\n"
        "    gpumem.configure(resource='vpool')\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n"
        "else:\n"
        "    raise AssertionError('a new configuration after the first allocation')\n"
        "assert lib.gpumem_malloc(128 << 20, 0, None) is None, 'max_size=64MiB still holds'\n"
        "lib.gpumem_free(p, 1 << 20, 0, None)\n"
        "print('child ok')\n"
    )
    assert "refused: gpumem: " in r.stdout


@newer("gpumem_configure")
def test_the_configuration_from_gpumem_conf_is_accepted_again(device):
    assert os.environ["GPUMEM_CONF"] == CONF  # in force since this process's first call
    # An allocation fixes it, whichever tests ran before this one.
    p = support.lib.gpumem_malloc(1 << 20, device, None)
    assert p
    support.lib.gpumem_free(p, 1 << 20, device, None)
    assert gpumem.configure(resource="pool", max_size=64 * MIB) == "resource=pool,max_size=67108864"
    with pytest.raises(ValueError, match="gpumem: "):
        gpumem.configure(resource="pool", max_size="32MiB")


def test_cupy_enable_checks_its_settings_first():
    with pytest.raises(ValueError, match='did you mean "max_size"'):
        gpumem.cupy.enable(max_sise="1GiB")
    with pytest.raises(ValueError, match="expected bytes"):
        gpumem.cupy.enable(stream_aware=True, max_size=2.5)


@newer("gpumem_configure")
def test_cupy_enable_configures_then_needs_cupy():
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: enable() would really switch allocators")
    r = child(
        "import gpumem, gpumem.cupy\n"
        "try:\n"
        "    gpumem.cupy.enable(resource='cuda', max_size='8MiB')\n"
        "except ImportError as e:\n"
        "    print('import error:', e)\n"
        "assert gpumem.library().gpumem_malloc(16 << 20, 0, None) is None, 'configured'\n"
        "print('child ok')\n"
    )
    assert "import error: gpumem.cupy needs CuPy" in r.stdout, (r.stdout, r.stderr)
    assert "child ok" in r.stdout, (r.stdout, r.stderr)


@newer("gpumem_configure")
def test_a_mempool_asked_to_recycle_keeps_expandable_heaps():
    # mempool() takes separate regions for CUDA IPC unless told otherwise;
    # recycle=True needs expandable heaps, so it keeps them.
    child_ok(
        "import gpumem, gpumem.torch as gt\n"
        "try:\n"
        "    gt.mempool(recycle=True)\n"
        "except ValueError as e:\n"
        "    raise AssertionError('refused: %s' % e)\n"
        "except Exception:\n"
        "    pass  # no PyTorch or no GPU here: gpumem was configured first\n"
        "lib = gpumem.library()\n"
        "p = lib.gpumem_malloc(1 << 20, 0, None)\n"
        "assert p\n"
        "lib.gpumem_free(p, 1 << 20, 0, None)\n"
        "assert gpumem.configure(recycle=True) == 'recycle=true', 'the configuration in force'\n"
        "print('child ok')\n"
    )


@newer("gpumem_configure")
def test_a_refused_configuration_keeps_the_one_in_force():
    r = child_ok(
        "import gpumem\n"
        "gpumem.configure(resource='pool', max_size='64MiB')\n"
        "try:\n"
        "    gpumem.configure(max_size='1GB!')\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n"
        "else:\n"
        "    raise AssertionError('accepted')\n"
        "assert gpumem.config_error() is None, gpumem.config_error()\n"
        "gpumem.check_config()\n"
        "lib = gpumem.library()\n"
        "p = lib.gpumem_malloc(1 << 20, 0, None)\n"
        "assert p, 'the configuration in force still serves'\n"
        "assert lib.gpumem_malloc(128 << 20, 0, None) is None, 'max_size=64MiB still holds'\n"
        "try:\n"
        "    gpumem.configure(resource='vpool')\n"
        "except ValueError as e:\n"
        "    print('refused after use:', e)\n"
        "assert gpumem.config_error() is None, 'a refusal is no invalid configuration'\n"
        "gpumem.check_config()\n"
        "lib.gpumem_free(p, 1 << 20, 0, None)\n"
        "print('child ok')\n"
    )
    refused = next(line for line in r.stdout.splitlines() if line.startswith("refused:"))
    assert "max_size" in refused and "unchanged" in refused, refused
    assert "refused after use: gpumem: " in r.stdout
