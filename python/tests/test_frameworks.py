"""PyTorch and CuPy in one process share gpumem's pool. Needs both, and a
GPU: GPUMEM_DEVICE=cuda (the simulated device's addresses hold no memory)."""

import importlib.util

import pytest

from support import SIM, child_ok

needs_gpu = pytest.mark.skipif(SIM, reason="needs a GPU (GPUMEM_DEVICE=cuda)")


def _needs(*frameworks):
    missing = [m for m in frameworks if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason="needs " + " and ".join(missing))


@needs_gpu
@_needs("torch")
def test_torch_allocates_through_gpumem():
    child_ok(
        "import gpumem, gpumem.torch\n"
        "gpumem.torch.enable()\n"
        "import torch\n"
        "x = torch.ones(1 << 20, device='cuda')\n"
        "assert gpumem.allocated_bytes(0) >= 4 << 20\n"
        "assert float(x.sum()) == 1 << 20\n"
        "del x\n"
        "torch.cuda.synchronize()\n"
        "assert gpumem.allocated_bytes(0) == 0\n"
        "print('child ok')\n",
        conf="resource=pool",
    )


@needs_gpu
@_needs("torch", "cupy")
def test_a_cupy_array_and_a_torch_tensor_share_reserved_bytes():
    # Both allocate on the legacy default stream: a block one frees, the other
    # gets back at once, without reserving anything new (the reductions that
    # check the contents may grow the pool for their own temporaries).
    r = child_ok(
        "import gpumem, gpumem.torch, gpumem.cupy\n"
        "gpumem.torch.enable()\n"
        "gpumem.cupy.enable()\n"
        "import torch, cupy\n"
        "n = 8 << 20\n"
        "t = torch.full((n,), 1, dtype=torch.uint8, device='cuda')\n"
        "torch.cuda.synchronize()\n"
        "reserved = gpumem.reserved_bytes(0)\n"
        "tensor_ptr = t.data_ptr()\n"
        "del t\n"
        "a = cupy.empty((n,), dtype=cupy.uint8)\n"
        "assert a.data.ptr == tensor_ptr, (hex(a.data.ptr), hex(tensor_ptr))\n"
        "assert gpumem.reserved_bytes(0) == reserved, (gpumem.reserved_bytes(0), reserved)\n"
        "a.fill(2)\n"
        "assert int(a.sum()) == 2 * n\n"
        "array_ptr = a.data.ptr\n"
        "del a\n"
        "cupy.cuda.Device().synchronize()\n"
        "reserved = gpumem.reserved_bytes(0)\n"
        "t = torch.empty((n,), dtype=torch.uint8, device='cuda')\n"
        "assert t.data_ptr() == array_ptr\n"
        "assert gpumem.reserved_bytes(0) == reserved, (gpumem.reserved_bytes(0), reserved)\n"
        "t.fill_(3)\n"
        "assert int(t.sum()) == 3 * n\n"
        "del t\n"
        "print('child ok', reserved)\n",
        conf="resource=pool",
    )
    assert "child ok" in r.stdout
