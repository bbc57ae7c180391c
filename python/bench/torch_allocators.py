"""PyTorch training under PyTorch's allocator and under gpumem, side by side.

    python3 python/bench/torch_allocators.py speed  --out results.jsonl
    python3 python/bench/torch_allocators.py batch  --out results.jsonl --free-gib 6
    python3 python/bench/torch_allocators.py graph  --out results.jsonl --configs torch,native:pool

Every configuration runs in a fresh process (this script calling itself with
``child``). Configurations: ``torch`` (PyTorch's caching allocator;
``torch+SETTINGS`` sets ``PYTORCH_CUDA_ALLOC_CONF=SETTINGS``),
``native:RESOURCE`` and ``pluggable:RESOURCE`` (gpumem.torch.enable),
``mempool:RESOURCE`` (gpumem.torch.mempool around the training loop);
more GPUMEM_CONF settings follow the resource after ``+``
(``native:pool+spread=always``).

- speed: GPT-2 small (8 x 1024 tokens, AdamW) and ResNet-50 (batch 64,
  224 x 224, SGD), bf16 autocast: seconds per iteration over 20 iterations
  after 5 warm-up ones, and peak reserved memory (PyTorch's
  max_memory_reserved where it works, gpumem's own peak otherwise).
- batch: with all but --free-gib GiB of the GPU taken by a raw cudaMalloc
  ballast (CuPy's runtime.malloc), the largest batch of 1024-token sequences
  of GPT-2 medium that trains one step, found in one process by doubling and
  bisection, catching torch.OutOfMemoryError.
- graph: a GPT-2 small training step (8 x 1024 tokens, bf16 autocast,
  capturable AdamW; gpumem.graph_models.gpt) captured with torch.cuda.graph:
  seconds per replay over 50 replays after 5, three rounds alternating the
  configurations.

Each result is one JSON line with date, device and command.
"""

import argparse
import contextlib
import datetime
import gc
import json
import os
import subprocess
import sys
import time

CONFIGS = ["torch", "native:pool", "native:vpool", "pluggable:pool", "mempool:vpool"]


def setup(config):
    """Installs the allocator of `config`; returns a function that makes the
    context each training loop runs in (the MemPool's, or none)."""
    import torch

    kind, _, rest = config.partition(":")
    if kind == "torch":
        return contextlib.nullcontext
    import gpumem.torch as gt

    # `native:pool+spread=always`: more GPUMEM_CONF settings after the resource.
    resource, *extra = rest.split("+")
    settings = dict(e.split("=", 1) for e in extra)
    if kind in ("native", "pluggable"):
        got = gt.enable(mode=kind, resource=resource, **settings)
        assert got == kind, (got, kind)
        return contextlib.nullcontext
    pool = gt.mempool(resource=resource, **settings)
    return lambda: torch.cuda.use_mem_pool(pool)


def peak_reserved(config):
    import torch

    if config.startswith("pluggable"):
        import gpumem

        return gpumem.peak_reserved_bytes(0)
    return torch.cuda.max_memory_reserved()


def gpt2(batch, seq=1024):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config()).cuda()
    return lm_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), batch, seq)


def lm_step(model, opt, batch, seq):
    """One training step of a causal LM on `batch` random sequences."""
    import torch

    x = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def resnet50(batch=64):
    import torch
    import torchvision

    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def child_speed(config, model):
    import torch

    make_ctx = setup(config)
    with make_ctx():
        step = gpt2(8) if model == "gpt2" else resnet50()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            loss = step()
        torch.cuda.synchronize()
        secs = (time.perf_counter() - t) / 20
    return {"bench": "speed", "model": model, "s_per_iter": secs, "loss": loss.item(),
            "peak_reserved": peak_reserved(config), "max_allocated": torch.cuda.max_memory_allocated()
            if not config.startswith("pluggable") else None}


def child_graph(config):
    """A GPT-2 small training step (8 x 1024 tokens, bf16 autocast, AdamW)
    captured into a CUDA graph: seconds per replay, and per eager step of
    the same model for reference."""
    import torch
    from gpumem.graph_models import captured_step, gpt

    setup(config)
    model = gpt().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
    tokens = torch.randint(0, 50257, (8, 1024), device="cuda")
    g, loss = captured_step(model, opt, tokens, warmup=3, autocast=torch.bfloat16)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(50):
        g.replay()
    torch.cuda.synchronize()
    replay = (time.perf_counter() - t) / 50
    return {"bench": "graph", "model": "gpt2", "s_per_replay": replay, "loss": loss.item(),
            "peak_reserved": peak_reserved(config)}


def child_batch(config, free_gib):
    import cupy
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    free, _ = cupy.cuda.runtime.memGetInfo()
    ballast = cupy.cuda.runtime.malloc(max(0, free - int(free_gib * (1 << 30))))
    make_ctx = setup(config)
    tried, ooms = [], 0
    with make_ctx():
        # GPT-2 medium (355M parameters), built once: every try trains one
        # step with the same weights and optimizer state, as a user raising
        # the batch would.
        model = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def fits(b):
            nonlocal ooms
            try:
                lm_step(model, opt, b, 1024)()
                torch.cuda.synchronize()
                ok = True
            except torch.OutOfMemoryError:
                ooms += 1
                ok = False
                opt.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            tried.append((b, ok))
            return ok

        lo, hi = 0, 1
        while fits(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        peak = torch.cuda.max_memory_reserved()
    cupy.cuda.runtime.free(ballast)
    return {"bench": "batch", "model": "gpt2-medium", "free_gib": free_gib, "largest_batch": lo, "tries": tried,
            "ooms": ooms, "peak_reserved": peak}


def run(kind, configs, out, extra):
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    date = datetime.date.today().isoformat()
    command = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    jobs = [(c, m) for c in configs for m in (["gpt2", "resnet50"] if kind == "speed" else ["gpt2"])]
    if kind == "graph":
        # Alternate the configurations, three rounds, so drift hits all alike.
        jobs = [(c, "gpt2") for _ in range(3) for c in configs]
    for config, model in jobs:
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        base, plus, settings = config.partition("+")
        if base == "torch" and plus:
            env["PYTORCH_CUDA_ALLOC_CONF"] = settings
            config_arg = "torch"
        else:
            config_arg = config
        p = subprocess.run([sys.executable, __file__, "child", kind, config_arg, model, str(extra)],
                           capture_output=True, text=True, timeout=900, env=env)
        lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        row = json.loads(lines[-1][7:]) if lines else {"bench": kind, "model": model,
                                                         "error": (p.stderr or p.stdout)[-800:]}
        row.update({"date": date, "device": device, "command": command, "config": config, "rc": p.returncode})
        line = json.dumps(row)
        print(line, flush=True)
        if out:
            with open(out, "a") as f:
                f.write(line + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["speed", "batch", "graph", "child"])
    ap.add_argument("rest", nargs="*")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out")
    ap.add_argument("--free-gib", type=float, default=6.0)
    a = ap.parse_args()
    if a.what == "child":
        kind, config, model, extra = a.rest
        if kind == "speed":
            r = child_speed(config, model)
        elif kind == "graph":
            r = child_graph(config)
        else:
            r = child_batch(config, float(extra))
        print("RESULT " + json.dumps(r), flush=True)
        return
    run(a.what, a.configs.split(","), a.out, a.free_gib)


if __name__ == "__main__":
    main()
