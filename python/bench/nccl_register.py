"""A gpumem MemPool registered with NCCL, and all-reduces from it, over
two or more GPUs (one process per GPU, started by torchrun).

    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG torchrun --nproc-per-node 2 \\
        python/bench/nccl_register.py --mib 256 --out nccl_register.jsonl

PyTorch's allocator stays in charge; the MemPool's segments come from
gpumem's NCCL-ready VirtualPool (``resource=vpool,nccl_ready=true``: one
physical allocation per block, exportable as a POSIX file descriptor, which
is how ncclMemAlloc lays memory out and what NCCL's registration needs).
Every rank:

1. allocates a tensor of ``--mib`` MiB in the pool and registers the pool
   with the process group (``ProcessGroupNCCL.register_mem_pool``);
2. all-reduces it and a tensor of the same size from PyTorch's own
   allocator (not registered), each filled with rank + 1, and checks that
   every element of both is the sum over ranks;
3. times all-reduces of each, in ``--rounds`` alternating rounds of
   ``--iters`` back-to-back all-reduces (CUDA events), after warm-ups.

Whether NCCL took the zero-copy path is NCCL's to say: with
``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG`` it prints one "register"
line per buffer it registers; the caller counts them in the log. Rank 0
prints one JSON line (``RESULT {...}``) and appends it to ``--out``.

NVLink multicast stays off: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.
"""

import argparse
import datetime
import json
import os
import statistics
import sys

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ[_k] = _v


def time_all_reduce(t, iters):
    import torch
    import torch.distributed as dist

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        dist.all_reduce(t)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters / 1000.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="nccl_register.jsonl")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    import gpumem.torch as gt

    rank, local, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    backend = dist.group.WORLD._get_backend(dev)
    if not hasattr(backend, "register_mem_pool"):
        print("nccl_register: this PyTorch has no ProcessGroupNCCL.register_mem_pool", file=sys.stderr)
        return 2
    n = args.mib * 2**20 // 4
    pool = gt.mempool(resource="vpool", nccl_ready=True)
    with torch.cuda.use_mem_pool(pool):
        registered = torch.empty(n, dtype=torch.float32, device=dev)
    backend.register_mem_pool(pool)
    plain = torch.empty(n, dtype=torch.float32, device=dev)

    want = world * (world + 1) / 2
    right = {}
    for name, t in (("registered", registered), ("plain", plain)):
        t.fill_(rank + 1)
        dist.all_reduce(t)
        right[name] = bool(torch.all(t == want).item())
        t.zero_()  # the timed all-reduces then add zeros: no overflow

    for t in (registered, plain):  # warm-up: connections, registration
        time_all_reduce(t, 3)
    times = {"registered": [], "plain": []}
    for r in range(args.rounds):
        order = ("registered", "plain") if r % 2 == 0 else ("plain", "registered")
        for name in order:
            times[name].append(time_all_reduce(registered if name == "registered" else plain, args.iters))
    # The slower rank's time decides.
    all_times = [None] * world
    dist.all_gather_object(all_times, times)
    all_right = [None] * world
    dist.all_gather_object(all_right, right)
    backend.deregister_mem_pool(pool)
    if rank == 0:
        med = {k: max(statistics.median(t[k]) for t in all_times) for k in times}
        nbytes = n * 4
        row = {"bench": "nccl_register", "date": datetime.date.today().isoformat(),
               "device": torch.cuda.get_device_name(dev), "world": world, "bytes": nbytes,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())), "torch": torch.__version__,
               "sums_right": all_right, "rounds": args.rounds, "iters": args.iters,
               "s_per_all_reduce": med,
               "s_per_all_reduce_rounds": {k: [max(t[k][i] for t in all_times) for i in range(args.rounds)]
                                           for k in times},
               # NCCL's convention: bus bandwidth = size / time * 2 (n-1) / n.
               "busbw_gb_s": {k: nbytes / v * 2 * (world - 1) / world / 1e9 for k, v in med.items()}}
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print("RESULT " + json.dumps(row), flush=True)
        print(f"nccl_register: {world} ranks, {args.mib} MiB fp32 all-reduce, sums right: "
              f"{all(all(r.values()) for r in all_right)}; registered {med['registered'] * 1e3:.3f} ms "
              f"({row['busbw_gb_s']['registered']:.0f} GB/s bus), plain {med['plain'] * 1e3:.3f} ms "
              f"({row['busbw_gb_s']['plain']:.0f} GB/s bus)", flush=True)
    dist.destroy_process_group()
    return 0 if all(all(r.values()) for r in all_right) else 1


if __name__ == "__main__":
    sys.exit(main())
