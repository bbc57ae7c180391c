"""The log setting: RMM's CSV log of every allocation made through the C ABI,
which `gpumem replay` reads."""

import csv
import json
import os
import re
import shutil
import subprocess

import pytest

from support import PYTHON_DIR, child_ok, newer

HEADER = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
WORKLOAD = (
    "lib = gpumem.library()\n"
    "p = lib.gpumem_malloc(1000, 0, None)\n"
    "q = lib.gpumem_malloc(1 << 20, 0, None)\n"
    "assert p and q\n"
    "assert lib.gpumem_malloc(1 << 40, 0, None) is None\n"
    "lib.gpumem_free(p, 1000, 0, None)\n"
    "lib.gpumem_free(q, 1 << 20, 0, None)\n"
    "print('child ok', hex(p), hex(q))\n"
)


def _record(tmp_path, route):
    """Runs WORKLOAD in a child that logs to a file (a name with capitals and
    a space, which must survive the configuration's parsing); returns the
    file and the two pointers."""
    path = tmp_path / "My Job.csv"
    if route == "configure":
        r = child_ok(
            "import gpumem\n"
            "gpumem.configure(resource='pool', max_size='64MiB', log=%r)\n" % str(path) + WORKLOAD
        )
    else:
        r = child_ok("import gpumem\n" + WORKLOAD, conf="resource=pool,max_size=64MiB,log=" + str(path))
    p, q = r.stdout.split()[-2:]
    return path, p, q


@newer("gpumem_configure")
@pytest.mark.parametrize("route", ["configure", "GPUMEM_CONF"])
def test_log_is_rmms_csv(tmp_path, route):
    path, p, q = _record(tmp_path, route)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == HEADER
    for row in rows[1:]:
        assert len(row) == 6, row
        thread, time, action, pointer, size, stream = row
        assert thread.isdigit(), row
        assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{6}", time), row
        assert re.fullmatch(r"0x[0-9a-f]+", pointer) and re.fullmatch(r"0x[0-9a-f]+", stream), row
        assert size.isdigit(), row
    calls = [(r[2], r[3], int(r[4])) for r in rows[1:] if r[2] != "allocate failure"]
    assert calls == [
        ("allocate", p, 1000),
        ("allocate", q, 1 << 20),
        ("free", p, 1000),
        ("free", q, 1 << 20),
    ]
    failures = [r for r in rows[1:] if r[2] == "allocate failure"]
    assert failures and all(r[3] == "0x0" and int(r[4]) == 1 << 40 for r in failures), failures


def _gpumem_cli():
    repo = os.path.dirname(PYTHON_DIR)
    roots = [os.environ.get("CARGO_TARGET_DIR") or os.path.join(repo, "target")]
    for root in roots:
        for profile in ("debug", "release"):
            exe = os.path.join(root, profile, "gpumem")
            if os.access(exe, os.X_OK):
                return exe
    return shutil.which("gpumem")


@newer("gpumem_configure")
def test_gpumem_replay_reads_the_log(tmp_path):
    cli = _gpumem_cli()
    if cli is None:
        pytest.skip("no gpumem command (cargo build -p gpumem-cli)")
    path, _, _ = _record(tmp_path, "configure")
    r = subprocess.run(
        [cli, "replay", str(path), "--alloc", "pool", "--device", "sim", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["alloc"] == "pool" and result["error"] is None, result
    assert result["ops"] == 4, "two allocations and two frees; the failure is skipped"
    assert result["peak_live"] == 1000 + (1 << 20), result


@newer("gpumem_configure")
def test_replay_through_the_job_s_configuration_reserves_what_the_job_did(tmp_path):
    """`gpumem replay --alloc R+K=V` builds what GPUMEM_CONF=resource=R,K=V
    serves: replayed through its own configuration, a job's log reserves
    what the job reserved."""
    cli = _gpumem_cli()
    if cli is None:
        pytest.skip("no gpumem command (cargo build -p gpumem-cli)")
    path = tmp_path / "job.csv"
    r = child_ok(
        "import gpumem\n" + WORKLOAD + "print('reserved', gpumem.peak_reserved_bytes(0))\n",
        conf="resource=pool,max_size=64MiB,log=" + str(path),
    )
    reserved = int(r.stdout.split()[-1])
    assert reserved > 0, r.stdout
    r = subprocess.run(
        [cli, "replay", str(path), "--alloc", "pool+max_size=64MiB", "--device", "sim", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["alloc"] == "pool+max_size=64MiB", result
    assert result["peak_reserved"] == reserved, (result, reserved)
