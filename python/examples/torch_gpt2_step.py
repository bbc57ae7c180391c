"""GPT-2 small built from transformers.GPT2Config() (random weights), batch
4 x 512 tokens, AdamW, a few training steps with PyTorch's CUDA allocations
served by gpumem.

    GPUMEM_LIB=/path/to/libgpumem.so python3 python/examples/torch_gpt2_step.py

Prints the loss (must be finite), torch's max allocated bytes, gpumem's
reserved and peak reserved bytes, and one summary line. `--native` runs the
same work on PyTorch's own allocator (the baseline).
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
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=512)
args = p.parse_args()

if not args.native:
    import gpumem.torch

    gpumem.torch.enable()  # before the first CUDA allocation

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

torch.backends.cudnn.benchmark = False
torch.manual_seed(0)
config = GPT2Config()
model = GPT2LMHeadModel(config).cuda()
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda")

losses = []
t0 = time.perf_counter()
for _ in range(args.steps):
    out = model(input_ids=ids, labels=ids)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    opt.step()
    losses.append(out.loss.item())
torch.cuda.synchronize()
dt = time.perf_counter() - t0
assert all(math.isfinite(v) for v in losses), losses

if args.native:
    print(json.dumps({"max_allocated": torch.cuda.max_memory_allocated(),
                      "max_reserved": torch.cuda.max_memory_reserved(), "losses": losses}))
    sys.exit(0)

print("loss per step             :", ", ".join("%.4f" % v for v in losses))
script = os.path.abspath(__file__)
torch_max, source = torch_max_allocated(
    torch, script, ["--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq)])
print("torch max allocated from  :", source)
peak_alloc, reserved, peak_reserved = gpumem_report(torch_max)
print(
    "SUMMARY gpt2 batch=%dx%d steps=%d conf=%r loss=%.4f torch_max_allocated=%s "
    "gpumem_peak_allocated=%s gpumem_reserved=%s gpumem_peak_reserved=%s "
    "peak_reserved/torch_max_allocated=%.3f time=%.2fs OK"
    % (args.batch, args.seq, args.steps, os.environ.get("GPUMEM_CONF", ""), losses[-1], gib(torch_max),
       gib(peak_alloc), gib(reserved), gib(peak_reserved), peak_reserved / float(torch_max), dt)
)
