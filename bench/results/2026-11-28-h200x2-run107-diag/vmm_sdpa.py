# Which property of the NCCL-ready pool's memory breaks cuDNN's attention:
# q, k, v as strided views of one qkv buffer (as GPT-2's attention makes
# them), placed in memory made with cuMemCreate under each variant of the
# allocation properties and access list, on GPU DEV with every GPU visible.
import ctypes, os, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

dev = int(os.environ.get("DEV", "0"))
torch.cuda.set_device(dev)
torch.zeros(1, device="cuda")  # the primary context, current on this thread
cu = ctypes.CDLL("libcuda.so.1")

class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Flags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Loc),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", Flags)]
class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]

def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")

class Mem:
    def __init__(self, nbytes, rdma, posix, peers, reserve=0):
        p = Prop(type=1, requestedHandleTypes=1 if posix else 0, location=Loc(1, dev))
        p.allocFlags.gpuDirectRDMACapable = 1 if rdma else 0
        g = ctypes.c_size_t()
        check(cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p), 0), "granularity")
        self.size = (nbytes + g.value - 1) // g.value * g.value
        h = ctypes.c_ulonglong()
        check(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(self.size), ctypes.byref(p), ctypes.c_ulonglong(0)), "create")
        ptr = ctypes.c_ulonglong()
        # `reserve` bytes of address space (0: the allocation's own size),
        # the memory mapped a quarter of the way in, as a pool lays it out.
        span = (max(reserve, self.size) + g.value - 1) // g.value * g.value
        check(cu.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(span), ctypes.c_size_t(g.value), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "reserve")
        ptr = ctypes.c_ulonglong(ptr.value + (span - self.size) // 4 // g.value * g.value)
        check(cu.cuMemMap(ptr, ctypes.c_size_t(self.size), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0)), "map")
        devs = range(torch.cuda.device_count()) if peers else [dev]
        acc = (Access * len(devs))(*[Access(Loc(1, d), 3) for d in devs])
        check(cu.cuMemSetAccess(ptr, ctypes.c_size_t(self.size), acc, ctypes.c_size_t(len(devs))), "access")
        self.ptr = ptr.value
        self.__cuda_array_interface__ = {"shape": (nbytes // 2,), "typestr": "<i2", "data": (self.ptr, False), "version": 3}

b, t, h, d = 8, 1024, 12, 64
src = torch.randn(b, t, 3 * h * d, device="cuda", dtype=torch.bfloat16)
def attn(buf):
    qkv = buf.view(b, t, 3 * h * d)
    q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in qkv.split(h * d, dim=2))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    return y
ref = attn(src.clone())
total = torch.cuda.get_device_properties(dev).total_memory
variants = [(r, p, q, 0) for r, p, q in ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 1, 1))]
variants += [(1, 1, q, k * total) for k in (1, 2) for q in (0, 1)]
for rdma, posix, peers, reserve in variants:
    name = f"dev {dev} rdma={rdma} posix_fd={posix} peers={peers} reserve={reserve / total:.0f}x memory"
    try:
        m = Mem(src.numel() * 2, rdma, posix, peers, reserve)
        buf = torch.as_tensor(m, device="cuda").view(torch.bfloat16)
        buf.copy_(src.view(-1))
        y = attn(buf)
        print(f"{name}: ok, same as torch's memory: {torch.equal(y, ref)}", flush=True)
    except Exception as e:
        print(f"{name}: FAILED {str(e)[:200]}", flush=True)
