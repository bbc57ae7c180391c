"""ResNet-18 (torchvision, random weights), batch 32 at 224x224, SGD, a few
training steps with PyTorch's CUDA allocations served by gpumem.

    GPUMEM_LIB=/path/to/libgpumem.so python3 python/examples/torch_resnet18_step.py
    GPUMEM_CONF=resource=caching ... (any configuration)

Prints the loss (must be finite), torch's max allocated bytes, gpumem's
reserved and peak reserved bytes, and one summary line. `--native` runs the
same work on PyTorch's own allocator and prints a JSON line (the baseline
this script uses when PyTorch reports no statistics for a pluggable
allocator).
"""

import argparse
import json
import math
import os
import sys
import time

from _common import gib, gpumem_report, torch_max_allocated

p = argparse.ArgumentParser()
p.add_argument("--native", action="store_true", help="PyTorch's own allocator (baseline)")
p.add_argument("--steps", type=int, default=2)
p.add_argument("--batch", type=int, default=32)
args = p.parse_args()

if not args.native:
    import gpumem.torch

    gpumem.torch.enable()  # before the first CUDA allocation

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402

torch.backends.cudnn.benchmark = False  # cudnn's benchmark asks the allocator for cacheInfo
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(args.batch, 3, 224, 224, device="cuda")
y = torch.randint(0, 1000, (args.batch,), device="cuda")

losses = []
t0 = time.perf_counter()
for _ in range(args.steps):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())
torch.cuda.synchronize()
dt = time.perf_counter() - t0
assert all(math.isfinite(v) for v in losses), losses

if args.native:
    print(json.dumps({"max_allocated": torch.cuda.max_memory_allocated(),
                      "max_reserved": torch.cuda.max_memory_reserved(), "losses": losses}))
    sys.exit(0)

print("loss per step             :", ", ".join("%.4f" % v for v in losses))
script = os.path.abspath(__file__)
torch_max, source = torch_max_allocated(torch, script, ["--steps", str(args.steps), "--batch", str(args.batch)])
print("torch max allocated from  :", source)
peak_alloc, reserved, peak_reserved = gpumem_report(torch_max)
print(
    "SUMMARY resnet18 batch=%d steps=%d conf=%r loss=%.4f torch_max_allocated=%s "
    "gpumem_peak_allocated=%s gpumem_reserved=%s gpumem_peak_reserved=%s "
    "peak_reserved/torch_max_allocated=%.3f time=%.2fs OK"
    % (args.batch, args.steps, os.environ.get("GPUMEM_CONF", ""), losses[-1], gib(torch_max),
       gib(peak_alloc), gib(reserved), gib(peak_reserved), peak_reserved / float(torch_max), dt)
)
