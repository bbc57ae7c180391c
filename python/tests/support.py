"""What the tests share: the environment the library reads, the library,
skip markers, and child processes for the configurations this process cannot
have.

The library reads GPUMEM_DEVICE and GPUMEM_CONF once, at its first call, so
this module sets them before gpumem is imported: the simulated device unless
GPUMEM_DEVICE says otherwise (``GPUMEM_DEVICE=cuda`` runs the same suite on a
GPU), and ``resource=pool,max_size=64MiB`` for this process. Tests that need
another configuration run it in a child process.

gpumem is imported from this checkout's python/ folder; with
GPUMEM_TEST_INSTALLED=1, from wherever it is installed (pip install ./python).
"""

import os
import subprocess
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS_DIR)
INSTALLED = os.environ.get("GPUMEM_TEST_INSTALLED") == "1"
if not INSTALLED and PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

os.environ.setdefault("GPUMEM_DEVICE", "sim")
CONF = "resource=pool,max_size=64MiB"
os.environ["GPUMEM_CONF"] = CONF

import gpumem  # noqa: E402

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
DEVICE_KIND = os.environ["GPUMEM_DEVICE"]
SIM = DEVICE_KIND == "sim"

lib = gpumem.library()

sim_only = pytest.mark.skipif(not SIM, reason="uses handles only the simulated device accepts")


def newer(*names):
    """Skips a test of issue 16's C ABI functions while the library lacks them."""
    missing = [name for name in names if not hasattr(lib, name)]
    return pytest.mark.skipif(
        bool(missing),
        reason="%s lacks %s (issue 16's C ABI, not in this build yet)"
        % (gpumem.library_path(), ", ".join(missing)),
    )


def child(code, conf="", env=None, timeout=120):
    """Runs `code` in a fresh Python with GPUMEM_CONF=`conf` and this
    process's library and device; returns the CompletedProcess (text)."""
    full_env = dict(os.environ, GPUMEM_CONF=conf, GPUMEM_LIB=gpumem.library_path())
    full_env.update(env or {})
    prologue = "" if INSTALLED else "import sys; sys.path.insert(0, %r)\n" % PYTHON_DIR
    return subprocess.run(
        [sys.executable, "-c", prologue + code],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def child_ok(code, conf="", env=None):
    """child(), which must exit 0 having printed "child ok"; returns it."""
    r = child(code, conf, env)
    assert r.returncode == 0 and "child ok" in r.stdout, (conf, r.stdout, r.stderr)
    return r
