"""CuPy under gpumem: a matrix product and a reduction compared with NumPy.

    GPUMEM_LIB=/path/to/libgpumem.so python3 python/examples/cupy_check.py [--stream-aware]

Also checks that an impossible request raises CuPy's OutOfMemoryError, and
that a non-default stream works. Prints the max errors and one summary line.
"""

import argparse
import os

import numpy as np

from _common import gib

p = argparse.ArgumentParser()
p.add_argument("--stream-aware", action="store_true", help="pass CuPy's current stream to gpumem")
p.add_argument("--n", type=int, default=2048)
args = p.parse_args()

import gpumem.cupy  # noqa: E402

gpumem.cupy.enable(stream_aware=args.stream_aware)

import cupy as cp  # noqa: E402

rng = np.random.default_rng(0)
a = rng.standard_normal((args.n, args.n))
b = rng.standard_normal((args.n, args.n))
ga, gb = cp.asarray(a), cp.asarray(b)
gc = ga @ gb
c = a @ b
mm_err = float(np.max(np.abs(cp.asnumpy(gc) - c)) / np.max(np.abs(c)))
s_err = abs(float(cp.sum(ga)) - float(np.sum(a))) / max(1.0, abs(float(np.sum(a))))
print("matmul max relative error :", mm_err)
print("sum relative error        :", s_err)
assert mm_err < 1e-10 and s_err < 1e-10

# Work on a non-default (non-blocking) stream, freeing and reallocating there.
with cp.cuda.Stream(non_blocking=True) as s:
    for i in range(50):
        t = cp.arange(1 << 20, dtype=cp.float64) * i
        assert float(t[-1]) == float((1 << 20) - 1) * i
        del t
    s.synchronize()

oom = False
try:
    cp.empty(1 << 50, dtype=cp.uint8)  # 1 PiB
except cp.cuda.memory.OutOfMemoryError:
    oom = True
assert oom, "1 PiB did not raise OutOfMemoryError"

dev = cp.cuda.runtime.getDevice()
alloc, reserved, peak = (gpumem.cupy.allocated_bytes(dev), gpumem.cupy.reserved_bytes(dev),
                         gpumem.cupy.peak_reserved_bytes(dev))
print("gpumem allocated now      :", gib(alloc))
print("gpumem reserved now       :", gib(reserved))
print("gpumem peak reserved      :", gib(peak))
assert alloc >= 3 * args.n * args.n * 8, "the three live matrices are counted"
assert peak >= reserved >= alloc
del ga, gb, gc
gpumem.cupy.empty_cache(dev)
print(
    "SUMMARY cupy n=%d stream_aware=%s conf=%r matmul_rel_err=%.2e sum_rel_err=%.2e oom_raised=%s "
    "peak_reserved=%s reserved_after_empty_cache=%s OK"
    % (args.n, args.stream_aware, os.environ.get("GPUMEM_CONF", ""), mm_err, s_err, oom, gib(peak),
       gib(gpumem.cupy.reserved_bytes(dev)))
)
