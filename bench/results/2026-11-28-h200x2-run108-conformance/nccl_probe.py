# Which buffer of cuDNN's attention the NCCL-ready pool's memory breaks:
# q, k, v (one qkv buffer) from gpumem's C ABI under
# GPUMEM_CONF=resource=vpool,nccl_ready=true, everything else (output,
# statistics, workspace) from PyTorch's allocator; both GPUs visible.
import ctypes, os, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
os.environ["GPUMEM_CONF"] = "resource=vpool,nccl_ready=true"
os.environ["GPUMEM_DEVICE"] = "cuda"
torch.cuda.set_device(0)
torch.zeros(1, device="cuda")
lib = ctypes.CDLL(os.environ["GPUMEM_LIB"])
lib.gpumem_malloc.restype = ctypes.c_void_p
lib.gpumem_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
b, t, h, d = 8, 1024, 12, 64
n = b * t * 3 * h * d * 2
class Buf:
    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes // 2,), "typestr": "<i2", "data": (ptr, False), "version": 3}
src = torch.randn(b, t, 3 * h * d, device="cuda", dtype=torch.bfloat16)
def attn(buf):
    q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in buf.view(b, t, 3 * h * d).split(h * d, dim=2))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    return y
ref = attn(src)
for size in (n, 2 << 20):
    p = lib.gpumem_malloc(max(size, n), 0, None)
    buf = torch.as_tensor(Buf(p, n), device="cuda").view(torch.bfloat16)
    buf.copy_(src.view(-1))
    try:
        y = attn(buf)
        print(f"q/k/v from gpumem nccl_ready ({max(size, n)} bytes): ok, same: {torch.equal(y, ref)}", flush=True)
    except Exception as e:
        print(f"q/k/v from gpumem nccl_ready: FAILED {str(e)[:100]}", flush=True)
        break
