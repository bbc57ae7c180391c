# Which SDPA backends run on tensors from gpumem's NCCL-ready vpool.
import os, sys, torch
import gpumem.torch as gt
conf = sys.argv[1] if len(sys.argv) > 1 else "vpool+nccl_ready=true"
res, *extra = conf.split("+")
gt.enable(mode="native", resource=res, **dict(e.split("=", 1) for e in extra))
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
    for shape in ((8, 12, 1024, 64), (1, 1, 128, 64)):
        try:
            q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            with sdpa_kernel(backend):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                y.sum().backward()
            torch.cuda.synchronize()
            print(f"{conf} {backend.name} {shape}: ok", flush=True)
        except Exception as e:
            print(f"{conf} {backend.name} {shape}: FAILED {str(e)[:300]}", flush=True)
# Pointers and their attributes, as cuDNN sees them.
x = torch.empty(1000, device="cuda")
import ctypes
print("ptr", hex(x.data_ptr()), "gpumem stats", gt.reserved_bytes(), flush=True)
