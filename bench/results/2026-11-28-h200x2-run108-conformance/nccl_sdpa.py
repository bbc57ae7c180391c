# cuDNN's attention on strided q, k, v of one qkv buffer from gpumem's
# NCCL-ready pool (both GPUs visible), and what the driver says of the
# buffer's pointer beside memory made with cuMemCreate by hand.
import ctypes, os, sys, torch
import torch.nn.functional as F
import gpumem.torch as gt
from torch.nn.attention import sdpa_kernel, SDPBackend
gt.enable(mode="native", resource="vpool", nccl_ready="true")
torch.cuda.set_device(0)
cu = ctypes.CDLL("libcuda.so.1")
ATTRS = {"DEVICE_ORDINAL": 9, "RANGE_START_ADDR": 11, "RANGE_SIZE": 12, "MAPPED": 13, "ALLOWED_HANDLE_TYPES": 14,
         "IS_GPU_DIRECT_RDMA_CAPABLE": 15, "ACCESS_FLAGS": 16, "MAPPING_SIZE": 18, "MAPPING_BASE_ADDR": 19,
         "MEMORY_BLOCK_ID": 20, "CONTEXT": 1, "MEMORY_TYPE": 2, "IS_LEGACY_CUDA_IPC_CAPABLE": 10}
def attrs(ptr):
    out = {}
    for name, a in ATTRS.items():
        v = ctypes.c_ulonglong(0)
        r = cu.cuPointerGetAttribute(ctypes.byref(v), ctypes.c_int(a), ctypes.c_ulonglong(ptr))
        out[name] = (hex(v.value) if "ADDR" in name or name == "CONTEXT" else v.value) if r == 0 else f"err {r}"
    return out
b, t, h, d = 8, 1024, 12, 64
def attn(buf):
    q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in buf.split(h * d, dim=2))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    return y
qkv = torch.randn(b, t, 3 * h * d, device="cuda", dtype=torch.bfloat16)
for what, fn in (("strided", lambda: attn(qkv)),
                 ("contiguous", lambda: attn(torch.cat([z.contiguous() for z in qkv.split(h * d, dim=2)], dim=2)))):
    try:
        fn(); print(f"nccl_ready {what} q/k/v: ok", flush=True)
    except Exception as e:
        print(f"nccl_ready {what} q/k/v: FAILED {str(e)[:120]}", flush=True)
print("qkv", hex(qkv.data_ptr()), qkv.numel() * 2, attrs(qkv.data_ptr()), flush=True)
small = torch.empty(64, device="cuda")
print("small", hex(small.data_ptr()), attrs(small.data_ptr()), flush=True)
