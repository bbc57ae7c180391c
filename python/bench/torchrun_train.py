"""Training over several GPUs with torchrun (one process per GPU, NCCL),
under PyTorch's allocator or gpumem on every rank.

    python3 python/bench/torchrun_train.py compare --parallel ddp --nproc 2 --rounds 3 --out ddp.jsonl
    python3 python/bench/torchrun_train.py compare --parallel fsdp2 --model gpt-1b --out fsdp.jsonl
    torchrun --nproc-per-node 2 python/bench/torchrun_train.py worker --config native:vpool

``--parallel ddp`` wraps the model in DistributedDataParallel;
``--parallel fsdp2`` shards every block and the root with
``torch.distributed.fsdp.fully_shard`` (parameters in bf16, gradients
reduced in fp32, fp32 master weights sharded). Models:
``gpt2-small`` (124M parameters) and ``gpt-1b`` (a GPT-2-shaped decoder of
1.3B: width 2048, 24 layers), both ``gpumem.graph_models.gpt``.

``compare`` starts one torchrun job per configuration and round (each round
starts with the next configuration, so drift and order hit all alike) and
prints, per configuration:
- the final loss and the largest relative difference of any step's loss
  from the ``torch`` run's (same seeds, same data, same initial weights);
- the step time (the slower rank's median over the timed steps), as a
  median over rounds, and its ratio to ``torch``'s in the same round
  ("paired": the host's drift between rounds cancels), as a median;
- peak reserved memory per rank (the allocator's own peak);
- peak device memory in use per rank: the driver's total minus free
  (``torch.cuda.mem_get_info``), read after the forward pass, after the
  backward pass and after the optimizer step of every step; it counts what
  the allocator holds and everything else (CUDA context, NCCL's buffers,
  cuBLAS workspaces).

Configurations: ``torch`` (PyTorch's caching allocator);
``torch+KEY:VALUE`` (PyTorch's allocator with ``PYTORCH_CUDA_ALLOC_CONF`` set
to ``KEY:VALUE``, e.g. ``torch+expandable_segments:True``); ``native:R``,
``pluggable:R``, ``mempool:R`` as in ``torch_allocators.py``, GPUMEM_CONF
settings after ``+`` (``native:vpool+nccl_ready=true``); ``{rank}`` in a
setting is the rank (``native:vpool+log=fsdp-{rank}.csv``).

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

MODELS = {
    "gpt2-small": {"dim": 768, "layers": 12, "heads": 12},
    "gpt-1b": {"dim": 2048, "layers": 24, "heads": 16},
}


def torch_alloc_conf(config):
    """PYTORCH_CUDA_ALLOC_CONF for `config` (``torch+...``), else None."""
    kind, plus, rest = config.partition("+")
    return rest if kind == "torch" and plus else None


def allocator_config(config):
    """The configuration torch_allocators.setup knows (``torch+...`` is
    PyTorch's allocator, set up by its environment variable)."""
    return "torch" if torch_alloc_conf(config) else config


def wrap(model, parallel, local):
    import torch

    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[local])
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    return fully_shard(model, mp_policy=mp)


def worker(args):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, HERE)
    from torch_allocators import peak_reserved, setup
    from gpumem.graph_models import gpt

    rank, local, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    # `{rank}` in a setting (a log file's name) becomes the rank.
    config = allocator_config(args.config).replace("{rank}", str(rank))
    make_ctx = setup(config)
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    losses, times, in_use = [], [], []

    def sample():
        free, total = torch.cuda.mem_get_info()
        in_use.append(total - free)

    with make_ctx():
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = gpt(**MODELS[args.model])
        n_params = sum(p.numel() for p in model.parameters())
        model = wrap(model, args.parallel, local)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        data = torch.Generator(device="cuda")
        # DDP runs the forward pass under autocast; FSDP2 casts the
        # parameters itself (its mixed-precision policy).
        autocast = args.parallel == "ddp"
        for step in range(args.warmup + args.steps):
            data.manual_seed(1000 * step + rank)
            x = torch.randint(0, 50257, (args.batch, 1024), device="cuda", generator=data)
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = model(x)
            sample()
            loss.backward()
            sample()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sample()
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - t)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / world)
    mine = {"rank": rank, "peak_reserved": peak_reserved(config), "peak_in_use": max(in_use),
            "s_per_step": statistics.median(times)}
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        print("RESULT " + json.dumps({"config": args.config, "world": world, "losses": losses, "params": n_params,
                                      "s_per_step": max(r["s_per_step"] for r in ranks), "ranks": ranks}), flush=True)
    dist.destroy_process_group()


def compare(args):
    import torch

    configs = args.configs.split(",")
    base_name = configs[0] if args.baseline is None else args.baseline
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    command = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    runs = {c: [] for c in configs}
    started = time.time()
    for rnd in range(args.rounds):
        if rnd and args.deadline and time.time() - started > args.deadline:
            print(f"deadline: {rnd} rounds of {args.rounds} run", flush=True)
            break
        # Each round starts with another configuration: no order effect.
        k = rnd % len(configs)
        for config in configs[k:] + configs[:k]:
            env = dict(os.environ, **NO_MULTICAST)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if torch_alloc_conf(config):
                env["PYTORCH_CUDA_ALLOC_CONF"] = torch_alloc_conf(config)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={args.nproc}", __file__, "worker", "--config", config,
                   "--parallel", args.parallel, "--model", args.model,
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch)]
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
            got = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode != 0 or not got:
                tail = (p.stdout + p.stderr)[-3000:]
                print(f"{config} round {rnd}: FAILED (exit {p.returncode})\n{tail}", flush=True)
                runs[config].append({"config": config, "error": tail, "round": rnd})
                continue
            got[0]["round"] = rnd
            print(f"{config} round {rnd}: {got[0]['s_per_step']:.4f} s/step ({time.time() - t0:.0f} s)", flush=True)
            runs[config].append(got[0])
    base = [r for r in runs.get(base_name, []) if "error" not in r]
    base_time = statistics.median(r["s_per_step"] for r in base) if base else None
    rows = []
    for config, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        row = {"bench": f"torchrun_{args.parallel}", "date": datetime.date.today().isoformat(), "device": device,
               "command": command, "config": config, "model": args.model, "nproc": args.nproc,
               "batch_per_rank": args.batch, "steps": args.steps, "warmup": args.warmup,
               "rounds_ok": len(ok), "rounds": len(rs), "baseline": base_name}
        if ok:
            t = statistics.median(r["s_per_step"] for r in ok)
            row.update({"params": ok[0]["params"], "s_per_step": t, "losses": ok[0]["losses"],
                        "final_loss": ok[0]["losses"][-1],
                        "s_per_step_rounds": [r["s_per_step"] for r in ok],
                        # Memory varies little from round to round; the
                        # largest over rounds is reported, per rank.
                        "peak_reserved_per_rank": [max(r["ranks"][i]["peak_reserved"] for r in ok)
                                                   for i in range(args.nproc)],
                        "peak_in_use_per_rank": [max(r["ranks"][i]["peak_in_use"] for r in ok)
                                                 for i in range(args.nproc)]})
            if base_time:
                row["time_vs_base"] = t / base_time
                base_in = {r["round"]: r["s_per_step"] for r in base}
                paired = [r["s_per_step"] / base_in[r["round"]] for r in ok if r["round"] in base_in]
                row["time_vs_base_paired"] = statistics.median(paired) if paired else None
                row["time_vs_base_rounds"] = paired
                diffs = [abs(a - b) / abs(b) for a, b in zip(ok[0]["losses"], base[0]["losses"])]
                row["max_rel_loss_diff_vs_base"] = max(diffs)
                row["final_loss_diff_vs_base"] = ok[0]["losses"][-1] - base[0]["losses"][-1]
        rows.append(row)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"\n{args.parallel} {args.model}: {args.nproc} ranks, batch {args.batch} x 1024 per rank, {args.steps} "
          f"steps after {args.warmup}, median over the rounds run; vs {base_name}")
    print(f"{'config':<34} {'final loss':>10} {'diff':>9} {'max rel':>8} {'s/step':>8} {'paired':>7} {'spread':>13}"
          "  peak reserved GiB | peak in use GiB (per rank)")
    for row in rows:
        if "s_per_step" not in row:
            print(f"{row['config']:<34} FAILED")
            continue
        g = lambda xs: " ".join(f"{x / 2**30:.2f}" for x in xs)  # noqa: E731
        pr = row.get("time_vs_base_rounds") or [float("nan")]
        print(f"{row['config']:<34} {row['final_loss']:>10.4f} {row.get('final_loss_diff_vs_base', float('nan')):>9.1e} "
              f"{row.get('max_rel_loss_diff_vs_base', float('nan')):>8.1e} {row['s_per_step']:>8.4f} "
              f"{row.get('time_vs_base_paired') or float('nan'):>7.3f} {min(pr):>6.3f}-{max(pr):<6.3f}"
              f"  {g(row['peak_reserved_per_rank'])} | {g(row['peak_in_use_per_rank'])}")
    return 0 if all(r["rounds_ok"] == r["rounds"] for r in rows) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["compare", "worker"])
    ap.add_argument("--config", default="torch")
    ap.add_argument("--configs", default="torch,torch+expandable_segments:True,native:pool,native:vpool,"
                                         "native:vpool+nccl_ready=true")
    ap.add_argument("--baseline", default=None, help="configuration the others are compared with (default: the first)")
    ap.add_argument("--parallel", choices=["ddp", "fsdp2"], default="ddp")
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2-small")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=600, help="seconds for one torchrun job")
    ap.add_argument("--deadline", type=int, default=0, help="start no round after this many seconds (0: none)")
    ap.add_argument("--out", default="torchrun_train.jsonl")
    args = ap.parse_args()
    if args.what == "worker":
        worker(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
