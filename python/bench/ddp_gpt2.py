"""GPT-2 small trained with DistributedDataParallel over NCCL, one process per
GPU, under PyTorch's allocator or gpumem on every rank (issue 21).

    python3 python/bench/ddp_gpt2.py compare --nproc 2 --configs torch,native:pool,native:vpool \\
        --rounds 2 --out ddp.jsonl
    torchrun --nproc-per-node 2 python/bench/ddp_gpt2.py worker --config native:vpool

``compare`` starts one torchrun job per configuration and round (each round
starts with the next configuration, so drift and order hit all alike) and prints, per
configuration: the loss of every step against the ``torch`` run's (the data
and the initial weights are the same), the median step time and its ratio
to ``torch``'s (of the medians, and the median of the ratios to ``torch``
in the same round, "paired"), and the peak memory reserved on each rank. Configurations
are those of ``torch_allocators.py`` (``torch``, ``native:R``,
``pluggable:R``, ``mempool:R``).

``--register`` also checks, on every rank of the ``torch`` and ``mempool:R``
runs (a MemPool needs PyTorch's caching allocator in charge), that a gpumem
MemPool (under ``torch``: the NCCL-ready VirtualPool) can be registered with the NCCL process group (``register_mem_pool``, where this
PyTorch has it) and that an all-reduce of a tensor in that pool gives the
right sum.

NVLink multicast stays off in every process: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.

Each result is one JSON line with date, device and command.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
for _k, _v in NO_MULTICAST.items():
    os.environ[_k] = _v

HERE = os.path.dirname(os.path.abspath(__file__))


def register_check(config, rank, world):
    """Registers a gpumem MemPool with the NCCL process group and all-reduces
    a tensor allocated in it; returns what happened, in words."""
    import torch
    import torch.distributed as dist
    import gpumem.torch as gt

    kind, _, resource = config.partition(":")
    if kind not in ("torch", "mempool"):
        return None  # a MemPool needs PyTorch's caching allocator in charge
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    if not hasattr(backend, "register_mem_pool"):
        return "unsupported: this PyTorch has no ProcessGroupNCCL.register_mem_pool"
    # Under `mempool:R` gpumem is configured already; under `torch` it is
    # not, and gets the NCCL-ready VirtualPool (one physical allocation per
    # block, as ncclMemAlloc lays memory out).
    pool = gt.mempool(resource="vpool", nccl_ready=True) if kind == "torch" else gt.mempool()
    with torch.cuda.use_mem_pool(pool):
        t = torch.full((1 << 20,), float(rank + 1), device="cuda")
    try:
        backend.register_mem_pool(pool)
    except Exception as e:  # noqa: BLE001  (reported, not fatal)
        return f"register_mem_pool failed: {e}"
    dist.all_reduce(t)
    torch.cuda.synchronize()
    want = world * (world + 1) / 2
    got = t[0].item()
    ok = bool(torch.all(t == want).item())
    del t
    try:
        backend.deregister_mem_pool(pool)
    except Exception as e:  # noqa: BLE001
        return f"registered, all-reduce {'right' if ok else 'WRONG'}, deregister failed: {e}"
    return "ok" if ok else f"registered, but the all-reduce gave {got} instead of {want}"


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, HERE)
    from torch_allocators import peak_reserved, setup
    from gpumem.graph_models import gpt

    rank, local, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    make_ctx = setup(args.config)
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    registered = register_check(args.config, rank, world) if args.register else None
    losses, times = [], []
    with make_ctx():
        torch.manual_seed(0)
        model = DDP(gpt().cuda(), device_ids=[local])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        data = torch.Generator(device="cuda")
        for step in range(args.warmup + args.steps):
            data.manual_seed(1000 * step + rank)
            x = torch.randint(0, 50257, (args.batch, 1024), device="cuda", generator=data)
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - t)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / world)
    mine = {"rank": rank, "peak_reserved": peak_reserved(args.config), "s_per_step": statistics.median(times)}
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        print("RESULT " + json.dumps({"config": args.config, "world": world, "losses": losses,
                                      "s_per_step": max(r["s_per_step"] for r in ranks),
                                      "ranks": ranks, "register": registered}), flush=True)
    dist.destroy_process_group()


def compare(args):
    import torch

    configs = args.configs.split(",")
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    command = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    env = dict(os.environ, **NO_MULTICAST)
    runs = {c: [] for c in configs}
    for rnd in range(args.rounds):
        # Each round starts with another configuration: no order effect.
        k = rnd % len(configs)
        for config in configs[k:] + configs[:k]:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={args.nproc}", __file__, "worker", "--config", config,
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch)]
            if args.register and rnd == 0:
                cmd.append("--register")
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
            got = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode != 0 or not got:
                tail = (p.stdout + p.stderr)[-3000:]
                print(f"{config} round {rnd}: FAILED (exit {p.returncode})\n{tail}", flush=True)
                runs[config].append({"config": config, "error": tail})
                continue
            got[0]["round"] = rnd
            runs[config].append(got[0])
    base = [r for r in runs.get("torch", []) if "error" not in r]
    base_time = statistics.median(r["s_per_step"] for r in base) if base else None
    rows = []
    for config, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        row = {"bench": "ddp_gpt2", "date": datetime.date.today().isoformat(), "device": device,
               "command": command, "config": config, "nproc": args.nproc, "batch_per_rank": args.batch,
               "steps": args.steps, "rounds_ok": len(ok), "rounds": len(rs)}
        if ok:
            t = statistics.median(r["s_per_step"] for r in ok)
            row.update({"s_per_step": t, "losses": ok[0]["losses"],
                        "peak_reserved_per_rank": [r["peak_reserved"] for r in ok[0]["ranks"]],
                        "register": next((r["register"] for r in ok if r.get("register")), None)})
            row["s_per_step_rounds"] = [r["s_per_step"] for r in ok]
            if base_time:
                row["time_vs_torch"] = t / base_time
                # Against torch's time in the same round: the host's drift
                # between rounds cancels.
                torch_in = {r["round"]: r["s_per_step"] for r in base}
                paired = [r["s_per_step"] / torch_in[r["round"]] for r in ok if r["round"] in torch_in]
                row["time_vs_torch_paired"] = statistics.median(paired) if paired else None
                row["time_vs_torch_rounds"] = paired
                diffs = [abs(a - b) / abs(b) for a, b in zip(ok[0]["losses"], base[0]["losses"])]
                row["max_rel_loss_diff_vs_torch"] = max(diffs)
        rows.append(row)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"\nddp_gpt2: {args.nproc} ranks, batch {args.batch} x 1024 per rank, {args.steps} steps "
          f"after {args.warmup}, median over {args.rounds} rounds")
    print(f"{'config':<16} {'s/step':>8} {'vs torch':>9} {'paired':>7} {'loss diff':>10} {'final loss':>10}  peak reserved GiB per rank")
    for row in rows:
        if "s_per_step" not in row:
            print(f"{row['config']:<16} FAILED")
            continue
        peaks = " ".join(f"{p / 2**30:.2f}" for p in row["peak_reserved_per_rank"])
        paired = row.get("time_vs_torch_paired") or float("nan")
        print(f"{row['config']:<16} {row['s_per_step']:>8.4f} {row.get('time_vs_torch', float('nan')):>9.3f} {paired:>7.3f} "
              f"{row.get('max_rel_loss_diff_vs_torch', float('nan')):>10.2e} {row['losses'][-1]:>10.4f}  {peaks}")
        if row.get("register"):
            print(f"    register_mem_pool: {row['register']}")
    return 0 if all(r["rounds_ok"] == r["rounds"] for r in rows) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["compare", "worker"])
    ap.add_argument("--config", default="torch")
    ap.add_argument("--configs", default="torch,native:pool,native:vpool")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--register", action="store_true")
    ap.add_argument("--out", default="ddp_gpt2.jsonl")
    args = ap.parse_args()
    if args.what == "worker":
        worker(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
