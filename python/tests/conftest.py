"""Fixtures; support.py sets the library's environment first."""

import pytest

import support  # noqa: F401  (before gpumem: the environment the library reads)
import gpumem


@pytest.fixture
def device():
    """Device 0 with nothing live, nothing cached and fresh peaks (and fresh
    accumulated counters where the library has them); checks afterwards that
    the test freed what it allocated."""
    d = 0
    lib = support.lib
    assert gpumem.allocated_bytes(d) == 0, "an earlier test left blocks live"
    gpumem.empty_cache(d)
    gpumem.reset_peak(d)
    if hasattr(lib, "gpumem_reset_accumulated_stats"):
        lib.gpumem_reset_peak_stats(d)
        lib.gpumem_reset_accumulated_stats(d)
    yield d
    assert gpumem.allocated_bytes(d) == 0, "the test left blocks live"
