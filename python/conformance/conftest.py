"""Installs gpumem as PyTorch's allocator before PyTorch's own tests start,
when the conformance runner asks for it (GPUMEM_CONFORMANCE=native or
pluggable; the resource and its settings come from GPUMEM_CONF). Pytest
imports this file before the test module, so gpumem is in place before
anything touches CUDA."""

import os

_mode = os.environ.get("GPUMEM_CONFORMANCE", "").strip()
if _mode:
    import torch  # noqa: F401  (gpumem.torch needs it first)
    import gpumem.torch

    got = gpumem.torch.enable(mode=_mode)
    assert got == _mode, (got, _mode)
