"""Real PyTorch jobs under PyTorch's allocators and gpumem's, side by side.

    python3 python/bench/real_jobs.py run --out real_jobs.jsonl            # every job, 3 rounds
    python3 python/bench/real_jobs.py run --quick --jobs lm,gnn            # minutes
    python3 python/bench/real_jobs.py run --gpus 0,1 --deadline 480        # two at a time; stop starting at 480 s
    python3 python/bench/real_jobs.py run --first-round 2 --rounds 1       # go on in another call
    python3 python/bench/real_jobs.py table real_jobs.raw.jsonl ...        # the table of several calls
    python3 python/bench/real_jobs.py list                                 # the jobs and configurations
    python3 python/bench/real_jobs.py child --job lm --config native:vpool+log=lm.csv --snapshot lm.pickle --steps 3
                                       # one job, with its log= recording and memory snapshot (gpumem view reads both)

The jobs use the libraries people train with (HF transformers, timm,
torch_geometric), models built from their configurations (no download) and
inputs made on the fly with fixed seeds, so every allocator sees the same
work:

- ``lm``: GPT-2 small training (transformers), batch 8, a new sequence
  length (128 to 1024 tokens) every step, bf16 autocast, AdamW;
- ``generate``: greedy generation of 16 tokens with a small Llama
  (transformers), a new batch size (1 to 16) and prompt length (32 to 512)
  every step;
- ``vision``: ResNet-50 training (timm), batch 64 at 224 x 224,
  ``cudnn.benchmark`` on, bf16 autocast, SGD;
- ``gnn``: GraphSAGE training (torch_geometric) on a new random graph
  (50,000 to 200,000 nodes, 10 edges each) every step;
- ``compile``: a transformer block under ``torch.compile(mode=
  "reduce-overhead")`` (CUDA graph trees) with the batch cycling through
  8, 32 and 128;
- ``threads``: inference of a ResNet-18 (timm) by 4 threads, each on its own
  stream; a step is one batch from every thread.

Configurations, each in a fresh process per round: ``torch`` (PyTorch's
caching allocator), ``torch+SETTINGS`` (with
``PYTORCH_CUDA_ALLOC_CONF=SETTINGS``, e.g. ``torch+expandable_segments:True``,
``torch+backend:cudaMallocAsync``), ``native:RESOURCE`` (gpumem.torch.enable,
more GPUMEM_CONF settings after ``+``). The rounds rotate the order of the
configurations. A process runs the jobs one after another, in the same
order under every configuration (``compile`` last: its CUDA graphs keep
their pool), each from an emptied cache with its peaks reset: a process
per job would pay PyTorch's start-up once per job and configuration.

A row per job and configuration: step time (median of the steady steps,
median over rounds) and its ratio to ``torch`` paired by round, with the
spread; the first three steps' time (the allocator's warm-up from an
emptied cache included) and its paired ratio; peak reserved and peak
allocated (PyTorch's counters), and peak reserved over the baseline's peak
allocated;
peak device memory in use (total - free, sampled after every step's
forward and backward: checks every allocator's own report); the final
loss (a checksum of the generated tokens for ``generate``), which must be
the same for every allocator. Peak in use is the device's, so it also
counts what earlier jobs of the process left (the CUDA context, cuBLAS
workspaces): ``start_in_use`` in the JSON line is the job's start.
``driver_calls_per_step`` counts the allocator's driver allocations and
frees (``num_device_alloc`` + ``num_device_free``) per steady step, and
``mapping_changes_per_step`` (``vpool`` only) the mappings it made and
unmapped, which allocate nothing but cost the host as much. Each
row is a JSON line with date, device and command; the table is printed
last.
"""

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = ["lm", "generate", "vision", "gnn", "threads", "compile"]
CONFIGS = ["torch", "torch+expandable_segments:True", "torch+backend:cudaMallocAsync",
           "native:pool", "native:vpool"]


# ----- the jobs: each returns step(i), which runs step i and returns its
# loss, calling `sample` after the forward and after the backward -----

def train(loss, opt, sample):
    """The rest of a training step after its forward pass."""
    sample()
    loss.backward()
    sample()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()

def job_lm(sample):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(1)

    def step(i):
        seq = rng.randrange(128, 1025)
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randint(0, 50257, (8, seq), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        return train(loss, opt, sample)

    return step


def job_generate(sample):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=1024)
    model = LlamaForCausalLM(cfg).cuda().to(torch.bfloat16).eval()
    rng = random.Random(2)

    @torch.no_grad()
    def step(i):
        batch, prompt = rng.choice([1, 2, 4, 8, 16]), rng.randrange(32, 513)
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randint(0, 32000, (batch, prompt), device="cuda", generator=g)
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, min_new_tokens=16,
                             do_sample=False, pad_token_id=0)
        sample()
        return float(out[:, prompt:].sum().item() % 1_000_003)

    return step


def job_vision(sample):
    import timm
    import torch

    torch.backends.cudnn.benchmark = True
    model = timm.create_model("resnet50", pretrained=False).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(i):
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randn(64, 3, 224, 224, device="cuda", generator=g).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (64,), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        return train(loss, opt, sample)

    return step


def job_gnn(sample):
    import torch
    from torch_geometric.nn import GraphSAGE

    model = GraphSAGE(128, 256, num_layers=3, out_channels=10).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = random.Random(3)

    def step(i):
        n = rng.randrange(50_000, 200_001)
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randn(n, 128, device="cuda", generator=g)
        edges = torch.randint(0, n, (2, 10 * n), device="cuda", generator=g)
        y = torch.randint(0, 10, (n,), device="cuda", generator=g)
        loss = torch.nn.functional.cross_entropy(model(x, edges), y)
        return train(loss, opt, sample)

    return step


def job_compile(sample):
    import torch

    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True).cuda()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4)
    fwd = torch.compile(layer, mode="reduce-overhead")

    def step(i):
        batch = (8, 32, 128)[i % 3]
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randn(batch, 128, 512, device="cuda", generator=g)
        torch.compiler.cudagraph_mark_step_begin()
        loss = fwd(x).float().pow(2).mean()
        return train(loss, opt, sample)

    return step


def job_threads(sample):
    import timm
    import torch

    model = timm.create_model("resnet18", pretrained=False).cuda().eval()
    streams = [torch.cuda.Stream() for _ in range(4)]
    device = torch.cuda.current_device()

    def step(i):
        sums = [0.0] * 4

        def infer(k):
            torch.cuda.set_device(device)
            with torch.cuda.stream(streams[k]), torch.no_grad():
                g = torch.Generator(device="cuda").manual_seed(4 * i + k)
                x = torch.randn(32, 3, 224, 224, device="cuda", generator=g)
                sums[k] = model(x).float().sum().item()

        threads = [threading.Thread(target=infer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sample()
        return sum(sums)

    return step


# ----- the jobs of one configuration, one after another, in this process -----

def run_job(job, steps, snapshot=None, snapshot_entries=0):
    """Runs one job from a clean allocator state (cache emptied, peaks
    reset) and returns its result."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free, total = torch.cuda.mem_get_info()
    in_use = [total - free]
    start_in_use = in_use[0]

    def sample():
        free, total = torch.cuda.mem_get_info()
        in_use.append(total - free)

    torch.manual_seed(0)
    times, losses = [], []
    if snapshot:
        # The allocator's history with Python and C++ stacks, as PyTorch's
        # memory viewer (and `gpumem view`) read it.
        torch.cuda.memory._record_memory_history(max_entries=snapshot_entries)
    step = globals()[f"job_{job}"](sample)

    def driver_calls():
        st = torch.cuda.memory_stats()
        return st.get("num_device_alloc", 0) + st.get("num_device_free", 0)

    def mappings():
        # vpool's mappings made and unmapped, which allocate nothing: None
        # under every other allocator (and without gpumem in the process).
        gm = sys.modules.get("gpumem")
        return gm.mapping_changes(torch.cuda.current_device()) if gm else None

    calls_before_steady = driver_calls()
    maps_before_steady = mappings()
    for i in range(3 + steps):
        if i == 3:
            calls_before_steady = driver_calls()
            maps_before_steady = mappings()
        torch.cuda.synchronize()
        t = time.perf_counter()
        losses.append(step(i))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    result = {"job": job, "first3_s": sum(times[:3]), "s_per_step": statistics.median(times[3:]),
              "losses": losses, "peak_reserved": torch.cuda.max_memory_reserved(),
              "peak_allocated": torch.cuda.max_memory_allocated(), "peak_in_use": max(in_use),
              "start_in_use": start_in_use,
              # The allocator's driver allocations and frees per steady step
              # (memory_stats' num_device_alloc + num_device_free).
              "driver_calls_per_step": (driver_calls() - calls_before_steady) / max(steps, 1)}
    maps = mappings()
    if maps is not None and maps_before_steady is not None:
        result["mapping_changes_per_step"] = (maps - maps_before_steady) / max(steps, 1)
    # What the job leaves behind (its model, cudnn.benchmark, compiled
    # graphs) must not reach the next job.
    del step
    torch.backends.cudnn.benchmark = False
    if job == "compile":
        torch._dynamo.reset()
    return result


def child(args):
    sys.path.insert(0, HERE)
    from torch_allocators import setup

    kind, plus, _ = args.config.partition("+")
    make_ctx = setup("torch" if kind == "torch" and plus else args.config)
    jobs = [args.job] if args.job else args.jobs.split(",")
    with make_ctx():
        for job in jobs:
            res = run_job(job, args.steps, args.snapshot, args.snapshot_entries)
            res["config"] = args.config
            print("RESULT " + json.dumps(res), flush=True)


# ----- every job under every configuration, in rotated rounds -----

def run(args):
    jobs, configs = args.jobs.split(","), args.configs.split(",")
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        sys.exit(f"unknown jobs {unknown}; known: {', '.join(JOBS)}")
    steps, rounds = (8, 1) if args.quick else (args.steps, args.rounds)
    command = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    device = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                            capture_output=True, text=True).stdout.strip()
    got = {(j, c): [] for j in jobs for c in configs}
    # One process per (round, configuration), in rotated order, running
    # every job in turn; with several GPUs that many run at once, one per
    # GPU (each process sees only its own).
    tasks = [(rnd, config) for rnd in range(args.first_round, args.first_round + rounds)
             for config in configs[rnd % len(configs):] + configs[:rnd % len(configs)]]
    gpus = queue.Queue()
    for g in args.gpus.split(","):
        gpus.put(g)
    start = time.time()

    def one(task):
        rnd, config = task
        if args.deadline and time.time() - start > args.deadline:
            return task, [], "not run: past the deadline"
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        kind, plus, settings = config.partition("+")
        if kind == "torch" and plus:
            env["PYTORCH_CUDA_ALLOC_CONF"] = settings
        g = gpus.get()
        env["CUDA_VISIBLE_DEVICES"] = g
        cmd = [sys.executable, __file__, "child", "--jobs", ",".join(jobs), "--config", config,
               "--steps", str(steps)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout * len(jobs))
            out, why = p.stdout, f"exit {p.returncode}\n{(p.stdout + p.stderr)[-2000:]}" if p.returncode else ""
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            why = f"no result in {args.timeout * len(jobs)} s"
        finally:
            gpus.put(g)
        res = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
        return task, res, why

    with cf.ThreadPoolExecutor(len(args.gpus.split(","))) as ex:
        for (rnd, config), res, why in ex.map(one, tasks):
            for r in res:
                r.update({"round": rnd, "steps": steps, "device": device,
                          "date": datetime.date.today().isoformat()})
                got[(r["job"], config)].append(r)
                with open(raw_path(args), "a") as f:
                    f.write(json.dumps(r) + "\n")
                print(f"{r['job']} {config} round {rnd}: {r['s_per_step']:.4f} s/step", flush=True)
            missing = [j for j in jobs if j not in {r["job"] for r in res}]
            if missing:
                print(f"{','.join(missing)} {config} round {rnd}: FAILED ({why or 'no result'})", flush=True)
    rows = summarize(got, jobs, configs, configs[0])
    with open(args.out, "a") as f:
        for row in rows:
            row.update({"bench": "real_jobs", "date": datetime.date.today().isoformat(), "device": device,
                        "command": command, "steps": steps})
            f.write(json.dumps(row) + "\n")
    print_table(rows, configs[0])
    return 0 if all(r["rounds_ok"] == rounds for r in rows) else 1


def raw_path(args):
    """Where every job's result is kept as it comes (`table` reads these)."""
    return args.raw or args.out.removesuffix(".jsonl") + ".raw.jsonl"


def table(args):
    """The table of results kept by several `run`s (rounds split over calls)."""
    got, jobs, configs = {}, [], args.configs.split(",")
    for path in args.raw_files:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["job"] not in jobs:
                    jobs.append(r["job"])
                got.setdefault((r["job"], r["config"]), []).append(r)
    jobs = [j for j in JOBS if j in jobs]
    rows = summarize({(j, c): got.get((j, c), []) for j in jobs for c in configs}, jobs, configs, configs[0])
    print_table(rows, configs[0])
    return 0


def summarize(got, jobs, configs, base):
    rows = []
    for job in jobs:
        by_round = {r["round"]: r["s_per_step"] for r in got[(job, base)]}
        first3_by_round = {r["round"]: r["first3_s"] for r in got[(job, base)]}
        base_allocated = max((r["peak_allocated"] for r in got[(job, base)]), default=None)
        for config in configs:
            rs = got[(job, config)]
            row = {"job": job, "config": config, "rounds_ok": len(rs)}
            if rs:
                paired = [r["s_per_step"] / by_round[r["round"]] for r in rs if r["round"] in by_round]
                first3 = [r["first3_s"] / first3_by_round[r["round"]] for r in rs if r["round"] in first3_by_round]
                peak_reserved = max(r["peak_reserved"] for r in rs)
                calls = [r["driver_calls_per_step"] for r in rs if "driver_calls_per_step" in r]
                maps = [r["mapping_changes_per_step"] for r in rs if "mapping_changes_per_step" in r]
                row.update({
                    "s_per_step": statistics.median(r["s_per_step"] for r in rs),
                    "vs_base": statistics.median(paired) if paired else None,
                    "vs_base_rounds": paired,
                    "first3_s": statistics.median(r["first3_s"] for r in rs),
                    "first3_vs_base": statistics.median(first3) if first3 else None,
                    "peak_reserved": peak_reserved,
                    # Issue 47's measure of leanness: reserved over what the
                    # baseline allocator counted as allocated at its peak.
                    "reserved_vs_base_allocated": peak_reserved / base_allocated if base_allocated else None,
                    "peak_allocated": max(r["peak_allocated"] for r in rs),
                    "peak_in_use": max(r["peak_in_use"] for r in rs),
                    # Absent from results kept before it was recorded.
                    "driver_calls_per_step": statistics.median(calls) if calls else None,
                    "mapping_changes_per_step": statistics.median(maps) if maps else None,
                    "final_loss": rs[0]["losses"][-1],
                    "same_losses_every_round": all(r["losses"] == rs[0]["losses"] for r in rs),
                })
            rows.append(row)
    return rows


def print_table(rows, base):
    gib = 2 ** 30

    def ratio(x):
        return f"{x:.3f}" if x is not None else "-"

    print(f"\n| job | configuration | s/step | vs {base} (spread) | first 3 steps s (vs {base}) | "
          f"peak reserved GiB | peak allocated GiB | reserved / {base}'s peak allocated | peak in use GiB | "
          "driver calls per step | vpool mapping changes per step | final loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "s_per_step" not in r:
            print(f"| {r['job']} | {r['config']} | failed | | | | | | | | | |")
            continue
        pr = r["vs_base_rounds"] or [float("nan")]
        vs = f"{r['vs_base']:.3f} ({min(pr):.3f}-{max(pr):.3f})" if r["vs_base"] else "-"
        calls = "-" if r["driver_calls_per_step"] is None else f"{r['driver_calls_per_step']:.1f}"
        maps = r.get("mapping_changes_per_step")
        maps = "-" if maps is None else f"{maps:.1f}"
        print(f"| {r['job']} | {r['config']} | {r['s_per_step']:.4f} | {vs} | "
              f"{r['first3_s']:.2f} ({ratio(r['first3_vs_base'])}) | "
              f"{r['peak_reserved'] / gib:.2f} | {r['peak_allocated'] / gib:.2f} | "
              f"{ratio(r['reserved_vs_base_allocated'])} | {r['peak_in_use'] / gib:.2f} | "
              f"{calls} | {maps} | {r['final_loss']:.4f} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["run", "child", "list", "table"])
    ap.add_argument("raw_files", nargs="*", help="(table) files of results kept by runs")
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--configs", default=",".join(CONFIGS), help="the first is the baseline of the ratios")
    ap.add_argument("--job", choices=JOBS, help="(child) one job to run, instead of --jobs")
    ap.add_argument("--config", default="torch", help="(child) the configuration")
    ap.add_argument("--snapshot", help="(child) write the job's memory snapshot (with stacks) to this pickle")
    ap.add_argument("--snapshot-entries", type=int, default=200_000,
                    help="(child) events the snapshot keeps, the latest")
    ap.add_argument("--steps", type=int, default=20, help="steady steps after the first three")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first-round", type=int, default=0,
                    help="number of the first round (its place in the rotation), to go on in another call")
    ap.add_argument("--quick", action="store_true", help="8 steady steps, one round")
    ap.add_argument("--timeout", type=int, default=300,
                    help="seconds for one job in one configuration (a process gets this times its jobs)")
    ap.add_argument("--gpus", default="0", help="GPUs to run on, one process on each at a time (0,1)")
    ap.add_argument("--deadline", type=int, default=0, help="start no job after this many seconds (0: none)")
    ap.add_argument("--out", default="real_jobs.jsonl")
    ap.add_argument("--raw", help="every job's result as it comes (default: OUT with .raw.jsonl)")
    args = ap.parse_args(argv)
    if args.what == "list":
        print("jobs:", ", ".join(JOBS))
        print("configurations:", ", ".join(CONFIGS))
        return 0
    if args.what == "child":
        child(args)
        return 0
    if args.what == "table":
        return table(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
