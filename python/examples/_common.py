"""Shared by the example scripts: import gpumem from python/, run a native
baseline, format bytes."""

import json
import os
import subprocess
import sys

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)


def gib(n):
    return "%.3f GiB" % (n / float(1 << 30))


def native_baseline(script, args):
    """Runs `script --native` in a child process (PyTorch's own allocator) and
    returns its JSON line: what PyTorch reports for the same work."""
    out = subprocess.run(
        [sys.executable, script, "--native"] + list(args),
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        sys.stderr.write(out.stdout + out.stderr)
        raise SystemExit("native baseline run failed")
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("native baseline printed no JSON line:\n" + out.stdout)


def torch_max_allocated(torch, script, args):
    """torch.cuda.max_memory_allocated() under gpumem if PyTorch answers it for
    a pluggable allocator; else the same work's figure under PyTorch's own
    allocator (a child process). Returns (bytes, where it came from)."""
    try:
        v = torch.cuda.max_memory_allocated()
        if v > 0:
            return v, "torch.cuda.max_memory_allocated() under gpumem"
    except RuntimeError:
        pass
    base = native_baseline(script, args)
    return base["max_allocated"], "torch.cuda.max_memory_allocated() of the same run on PyTorch's allocator"


def gpumem_report(torch_max):
    import gpumem.torch as gt

    peak_alloc = gt.peak_allocated_bytes()
    reserved = gt.reserved_bytes()
    peak_reserved = gt.peak_reserved_bytes()
    print("gpumem allocated now      :", gib(gt.allocated_bytes()))
    print("gpumem peak allocated     :", gib(peak_alloc))
    print("gpumem reserved now       :", gib(reserved))
    print("gpumem peak reserved      :", gib(peak_reserved))
    print("torch max allocated       :", gib(torch_max))
    assert peak_reserved >= peak_alloc, "peak reserved below peak allocated"
    # gpumem counts allocations at 256 B, PyTorch at 512 B (resource=cuda,
    # which reserves exactly what is live, measured 0.992 on ResNet-18):
    # allow 2% for that.
    assert peak_reserved >= 0.98 * torch_max, (
        "gpumem peak reserved %d < torch max allocated %d" % (peak_reserved, torch_max)
    )
    return peak_alloc, reserved, peak_reserved
