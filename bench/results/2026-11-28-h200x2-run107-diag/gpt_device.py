# GPT-2 small (gpumem.graph_models.gpt) trained for two steps on GPU DEV
# with every GPU visible, under autocast as the DDP job runs it but in one
# process: does the nccl_ready failure need DDP? Per SDPA backend.
import os, sys, torch
import gpumem.torch as gt
dev = int(os.environ.get("DEV", "0"))
conf = sys.argv[1] if len(sys.argv) > 1 else "vpool+nccl_ready=true"
res, *extra = conf.split("+")
gt.enable(mode="native", resource=res, **dict(e.split("=", 1) for e in extra))
torch.cuda.set_device(dev)
from torch.nn.attention import sdpa_kernel, SDPBackend
from gpumem.graph_models import gpt
torch.manual_seed(0)
with torch.device("cuda"):
    model = gpt(layers=2)
for backend in (None, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
    try:
        x = torch.randint(0, 50257, (8, 1024), device="cuda")
        ctx = sdpa_kernel(backend) if backend is not None else torch.autocast("cuda", enabled=False)
        with ctx, torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x)
        loss.backward()
        torch.cuda.synchronize()
        print(f"dev {dev} {conf} {getattr(backend, 'name', 'default')}: ok loss {loss.item():.4f}", flush=True)
    except Exception as e:
        print(f"dev {dev} {conf} {getattr(backend, 'name', 'default')}: FAILED {str(e)[:300]}", flush=True)
