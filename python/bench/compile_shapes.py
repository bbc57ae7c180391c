"""torch.compile(mode="reduce-overhead") with shapes that change, under
PyTorch's allocator or gpumem: CUDA graph trees record a graph per shape
and branch from saved pool states, which the allocator must restore.

    python3 python/bench/compile_shapes.py compare --configs torch,native:pool,native:vpool --out compile.jsonl
    python3 python/bench/compile_shapes.py child --config native:pool

A GPT-shaped decoder (gpumem.graph_models.gpt, width 256, 4 layers) is
called, in inference and in training (forward and backward compiled, the
loss's gradient taken), with batch sizes and sequence lengths that change
and come back (so graphs are recorded, replayed and branched from earlier
points of the tree). Every compiled result is compared with the eager
model's on the same input (relative tolerance 1e-2: Inductor's kernels
are not eager's). Each configuration runs in a fresh process; prints, per
configuration, whether every output matched, the number of calls, and the
peak memory reserved; appends one JSON line per configuration to --out.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(8, 64), (32, 128), (128, 256), (8, 64), (64, 32), (32, 128), (128, 256), (16, 200)]


def child(args):
    import torch

    sys.path.insert(0, HERE)
    from torch_allocators import peak_reserved, setup
    from gpumem.graph_models import gpt

    make_ctx = setup(args.config)
    torch.manual_seed(0)
    with make_ctx():
        model = gpt(vocab=1000, dim=256, layers=4, heads=4, seq=256).cuda()
        compiled = torch.compile(model, mode="reduce-overhead")
        worst, calls = 0.0, 0
        for train in (False, True):
            model.train(train)
            for rnd in range(2):
                for b, t in SHAPES:
                    x = torch.randint(0, 1000, (b, t), device="cuda")
                    if train:
                        loss = compiled(x)
                        loss.backward()
                        got = [loss.detach().float().item(), model.tok.weight.grad.float().norm().item()]
                        model.zero_grad(set_to_none=True)
                        ref = model(x)
                        ref.backward()
                        want = [ref.detach().float().item(), model.tok.weight.grad.float().norm().item()]
                        model.zero_grad(set_to_none=True)
                    else:
                        with torch.no_grad():
                            got = [compiled(x).float().item()]
                            want = [model(x).float().item()]
                    calls += 1
                    worst = max(worst, max(abs(g - w) / max(abs(w), 1e-6) for g, w in zip(got, want)))
        torch.cuda.synchronize()
    print("RESULT " + json.dumps({"config": args.config, "calls": calls, "max_rel_diff": worst,
                                  "peak_reserved": peak_reserved(args.config)}), flush=True)


def compare(args):
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    rows = []
    for config in args.configs.split(","):
        p = subprocess.run([sys.executable, __file__, "child", "--config", config], capture_output=True,
                           text=True, timeout=args.timeout)
        got = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        row = {"bench": "compile_shapes", "date": datetime.date.today().isoformat(), "device": device,
               "config": config, "shapes": SHAPES}
        if p.returncode != 0 or not got:
            row["error"] = (p.stdout + p.stderr)[-3000:]
        else:
            row.update(got[0])
            row["matched"] = got[0]["max_rel_diff"] <= 1e-2
        rows.append(row)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"compile_shapes: torch.compile(mode='reduce-overhead'), {len(SHAPES)} shapes x 2 rounds, inference and training")
    for row in rows:
        if "error" in row:
            print(f"{row['config']:<16} FAILED: {row['error'][-600:]}")
        else:
            print(f"{row['config']:<16} {row['calls']} calls, outputs {'match' if row['matched'] else 'DIFFER'} eager "
                  f"(max relative difference {row['max_rel_diff']:.1e}), peak reserved {row['peak_reserved'] / 2**20:.1f} MiB")
    return 0 if all(r.get("matched") for r in rows) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["compare", "child"])
    ap.add_argument("--config", default="torch")
    ap.add_argument("--configs", default="torch,native:pool,native:vpool")
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument("--out", default="compile_shapes.jsonl")
    args = ap.parse_args()
    if args.what == "child":
        child(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
