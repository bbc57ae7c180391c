"""A gpumem MemPool registered with NCCL, and all-reduces from it, over
two or more GPUs (one process per GPU, started by torchrun).

    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG torchrun --nproc-per-node 2 \\
        python/bench/nccl_register.py --mib 256 --out nccl_register.jsonl

PyTorch's allocator stays in charge; the MemPool's segments come from
gpumem's NCCL-ready VirtualPool (``resource=vpool,nccl_ready=true``: one
physical allocation per block, exportable as a POSIX file descriptor, which
is how ncclMemAlloc lays memory out and what NCCL's registration needs).
Every rank:

1. allocates tensors of ``--mib`` MiB in the pool and registers the pool
   with the process group (``ProcessGroupNCCL.register_mem_pool``);
2. all-reduces it (in place, as PyTorch's all_reduce always is) and
   all-gathers into a second tensor of the pool (out of place), and does
   the same with tensors of PyTorch's own allocator (not registered),
   checking every element;
3. times each operation on each kind of memory in ``--rounds`` alternating
   rounds of ``--iters`` back-to-back calls (CUDA events), after warm-ups.

Whether NCCL took the zero-copy path is NCCL's to say: with
``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG`` it prints "register comm"
when a buffer is registered and "IPC register buffer" when a collective
uses a registered buffer directly; the caller counts them in the log.
NCCL 2.23 to 2.28 take registered buffers directly (peer-to-peer within a
node) for out-of-place operations such as all-gather, not for an in-place
ring or tree all-reduce, and NVLink SHARP (which registers for all-reduce)
is off here. Rank 0 prints one JSON line (``RESULT {...}``) and appends it
to ``--out``.

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


def time_all_gather(out, inp, iters):
    import torch
    import torch.distributed as dist

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        dist.all_gather_into_tensor(out, inp)
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
    # Everything the registered runs use is allocated before the pool is
    # registered: registration covers the pool's segments of that moment.
    pool = gt.mempool(resource="vpool", nccl_ready=True)
    with torch.cuda.use_mem_pool(pool):
        reg = {"reduce": torch.empty(n, device=dev), "gather_in": torch.empty(n // world, device=dev),
               "gather_out": torch.empty(n, device=dev)}
    backend.register_mem_pool(pool)
    plain = {k: torch.empty_like(v) for k, v in reg.items()}
    bufs = {"registered": reg, "plain": plain}

    # Contents: the all-reduce sums rank + 1 over the ranks; the all-gather
    # puts rank r's slice (filled with r + 1) at slice r.
    want_gather = torch.arange(1, world + 1, device=dev, dtype=torch.float32).repeat_interleave(n // world)
    right = {}
    for name, b in bufs.items():
        b["reduce"].fill_(rank + 1)
        dist.all_reduce(b["reduce"])
        b["gather_in"].fill_(rank + 1)
        dist.all_gather_into_tensor(b["gather_out"], b["gather_in"])
        right[name] = {"all_reduce": bool(torch.all(b["reduce"] == world * (world + 1) / 2).item()),
                       "all_gather": bool(torch.equal(b["gather_out"], want_gather))}
        b["reduce"].zero_()  # the timed all-reduces then add zeros: no overflow
    del want_gather

    ops = {"all_reduce": lambda b, k: time_all_reduce(b["reduce"], k),
           "all_gather": lambda b, k: time_all_gather(b["gather_out"], b["gather_in"], k)}
    for op in ops.values():  # warm-up: connections, registration
        for b in bufs.values():
            op(b, 3)
    times = {f"{op}/{name}": [] for op in ops for name in bufs}
    for r in range(args.rounds):
        order = ("registered", "plain") if r % 2 == 0 else ("plain", "registered")
        for op, fn in ops.items():
            for name in order:
                times[f"{op}/{name}"].append(fn(bufs[name], args.iters))
    # The slower rank's time decides.
    all_times = [None] * world
    dist.all_gather_object(all_times, times)
    all_right = [None] * world
    dist.all_gather_object(all_right, right)
    backend.deregister_mem_pool(pool)
    ok = all(v for r in all_right for d in r.values() for v in d.values())
    if rank == 0:
        med = {k: max(statistics.median(t[k]) for t in all_times) for k in times}
        nbytes = n * 4
        row = {"bench": "nccl_register", "date": datetime.date.today().isoformat(),
               "device": torch.cuda.get_device_name(dev), "world": world, "bytes": nbytes,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())), "torch": torch.__version__,
               "contents_right": all_right, "rounds": args.rounds, "iters": args.iters,
               "seconds": med,
               "seconds_rounds": {k: [max(t[k][i] for t in all_times) for i in range(args.rounds)] for k in times},
               # NCCL's convention: bus bandwidth = size / time * factor,
               # 2 (n-1) / n for all-reduce and (n-1) / n for all-gather.
               "busbw_gb_s": {k: nbytes / v * (world - 1) / world * (2 if k.startswith("all_reduce") else 1) / 1e9
                              for k, v in med.items()}}
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print("RESULT " + json.dumps(row), flush=True)
        parts = ", ".join(f"{k} {v * 1e3:.3f} ms ({row['busbw_gb_s'][k]:.0f} GB/s bus)" for k, v in med.items())
        print(f"nccl_register: {world} ranks, {args.mib} MiB fp32, contents right: {ok}; {parts}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
