# Which SDPA backends run on tensors from a gpumem resource, on the GPU
# DEV (default 0) with every GPU visible: rank 1 of a torchrun job.
import os, sys, torch
import gpumem.torch as gt
dev = int(os.environ.get("DEV", "0"))
conf = sys.argv[1] if len(sys.argv) > 1 else "vpool+nccl_ready=true"
res, *extra = conf.split("+")
gt.enable(mode="native", resource=res, **dict(e.split("=", 1) for e in extra))
torch.cuda.set_device(dev)
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
            print(f"dev {dev} {conf} {backend.name} {shape}: ok", flush=True)
        except Exception as e:
            print(f"dev {dev} {conf} {backend.name} {shape}: FAILED {str(e)[:400]}", flush=True)
x = torch.empty(1000, device="cuda")
print("ptr", hex(x.data_ptr()), "device", x.device, flush=True)
