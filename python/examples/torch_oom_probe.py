"""What this PyTorch does when gpumem cannot serve a request (gpumem returns
NULL; PyTorch's CUDAPluggableAllocator may or may not check it).

    GPUMEM_CONF=max_size=1GiB GPUMEM_LIB=... python3 python/examples/torch_oom_probe.py

Prints one summary line: RAISES (PyTorch raised on the NULL: the good case)
or NULL-TENSOR (PyTorch made a tensor over address 0: a program must not rely
on catching OOM under gpumem with this PyTorch).
"""

import os

import _common  # noqa: F401  (puts python/ on sys.path)
import gpumem.torch

gpumem.torch.enable()
import torch  # noqa: E402

small = torch.ones(1024, device="cuda")  # works
try:
    t = torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB
except Exception as e:  # noqa: BLE001
    print("SUMMARY torch_oom_probe torch=%s RAISES %s: %s" % (torch.__version__, type(e).__name__,
                                                          str(e).splitlines()[0][:200]))
else:
    print("SUMMARY torch_oom_probe torch=%s NULL-TENSOR data_ptr=%#x conf=%r"
          % (torch.__version__, t.data_ptr(), os.environ.get("GPUMEM_CONF", "")))
