# A PyTorch user's view of recycle=True under max_size: near the limit, a
# hole left by a freed tensor makes room for a larger one; past the limit
# PyTorch raises OutOfMemoryError.
import sys
import gpumem.torch as gt

recycle = sys.argv[1] == "on"
gt.enable(recycle=recycle, max_size="2GiB")
import torch

MiB = 1 << 20
u8 = dict(dtype=torch.uint8, device="cuda")
x = torch.empty(1024 * MiB, **u8)
y = torch.full((64 * MiB,), 7, **u8)
f = torch.full((900 * MiB,), 5, **u8)
print(f"recycle={recycle}: x, y, f held, reserved {torch.cuda.memory_reserved() / MiB:.0f} MiB")
del x
sample = lambda t, v: bool(t[:: 1 << 16].eq(v).all().item())
try:
    z = torch.full((1064 * MiB,), 3, **u8)
    ok = sample(z, 3) and sample(y, 7) and sample(f, 5)
    print(f"recycle={recycle}: 1064 MiB after a freed 1024 MiB: allocated, data {'whole' if ok else 'WRONG'}, reserved {torch.cuda.memory_reserved() / MiB:.0f} MiB")
except torch.OutOfMemoryError as e:
    print(f"recycle={recycle}: 1064 MiB after a freed 1024 MiB: OutOfMemoryError, reserved {torch.cuda.memory_reserved() / MiB:.0f} MiB")
try:
    w = torch.empty(1024 * MiB, **u8)
    print(f"recycle={recycle}: 1 GiB more: allocated, reserved {torch.cuda.memory_reserved() / MiB:.0f} MiB")
except torch.OutOfMemoryError:
    print(f"recycle={recycle}: 1 GiB more: OutOfMemoryError, reserved {torch.cuda.memory_reserved() / MiB:.0f} MiB")
