"""PyTorch's caching allocator on the workloads ``gpumem bench`` runs, driven
from C++ through ``c10::cuda::CUDACachingAllocator::raw_alloc_with_stream``
and ``raw_delete`` (no tensors, no Python per operation), so its first,
second and steady passes can stand beside gpumem's in one table (issue 19).

    python3 python/bench/torch_trace_replay.py gpt2_train.rmm.csv resnet50_train.rmm.csv \\
        --passes 6 --out results.jsonl
    python3 python/bench/torch_trace_replay.py iter_1.0.rmm.csv --split-passes --out results.jsonl

A trace is an RMM log (``Thread,Time,Action,Pointer,Size,Stream``). By
default the whole trace is one pass, replayed ``--passes`` times through the
same allocator; with ``--split-passes`` the trace holds its own passes, told
apart by the pointer's bits 40 and up (how gpumem-cli's
``examples/iterations_trace.rs`` writes the ``iterations`` workload), and
each is replayed once, in order (frees by thread 2, the pass's cleanup,
are untimed). Trace stream 0 is the device's default
stream; every other trace stream gets a stream of its own. Whatever a pass
leaves live is freed after its clock stops, as ``gpumem bench`` does.

Per pass: ns per operation (an allocation or a free). Per trace: first,
second and steady (median of passes 3 on) ns per operation and peak
reserved (``reserved_bytes.all.peak``) over peak live. Each trace runs
``--repeats`` times, each in a fresh process; medians are reported. Each result is one JSON line with date, device and command.
"""

import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys

CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <chrono>
#include <vector>

namespace alloc = c10::cuda::CUDACachingAllocator;

// ops: int64 [n, 4] (slot, stream, size, alloc); starts: the first op of
// each pass. Returns ns per op of each pass, then the peak reserved bytes.
std::vector<double> replay(torch::Tensor ops, torch::Tensor starts, int64_t slots, int64_t streams) {
  auto o = ops.accessor<int64_t, 2>();
  auto s = starts.accessor<int64_t, 1>();
  int device = c10::cuda::current_device();
  std::vector<c10::cuda::CUDAStream> st;
  st.push_back(c10::cuda::getDefaultCUDAStream(device));
  for (int64_t i = 1; i < streams; i++) st.push_back(c10::cuda::getStreamFromPool(false, device));
  std::vector<void*> ptr(slots, nullptr);
  std::vector<double> out;
  int64_t n = ops.size(0), passes = starts.size(0);
  alloc::resetPeakStats(device);
  for (int64_t p = 0; p < passes; p++) {
    int64_t a = s[p], b = p + 1 < passes ? s[p + 1] : n;
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = a; i < b; i++) {
      if (o[i][3]) {
        ptr[o[i][0]] = alloc::raw_alloc_with_stream(o[i][2], st[o[i][1]].stream());
      } else {
        alloc::raw_delete(ptr[o[i][0]]);
        ptr[o[i][0]] = nullptr;
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    out.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / double(b - a));
    for (auto& q : ptr) {
      if (q) { alloc::raw_delete(q); q = nullptr; }
    }
  }
  auto stats = alloc::getDeviceStats(device);
  out.push_back(double(stats.reserved_bytes[0].peak));
  return out;
}
"""


def read_trace(path, split):
    """(ops, pass starts, slots, streams, peak live) of an RMM log. With
    `split`, frees written by thread 2 (a pass's cleanup of what it left
    live) are left out: the replay frees those after the pass's clock."""
    ops, starts, slot_of, free_slots, streams = [], [], {}, [], {0: 0}
    slots = live = peak = 0
    cur_pass = None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            action = row["Action"].strip()
            ptr, size = int(row["Pointer"], 16), int(row["Size"])
            stream = streams.setdefault(int(row["Stream"], 16), len(streams))
            if split and (ptr >> 40) != cur_pass:
                cur_pass = ptr >> 40
                starts.append(len(ops))
            if action == "allocate" and size > 0:
                if free_slots:
                    slot = free_slots.pop()
                else:
                    slot, slots = slots, slots + 1
                slot_of[ptr] = slot
                ops.append((slot, stream, size, 1))
                live += size
                peak = max(peak, live)
            elif action == "free" and ptr in slot_of:
                slot = slot_of.pop(ptr)
                free_slots.append(slot)
                live -= size
                if not (split and row["Thread"].strip() == "2"):
                    ops.append((slot, stream, size, 0))
    return ops, starts or [0], max(slots, 1), len(streams), peak


def child(args):
    import torch
    from torch.utils.cpp_extension import load_inline

    mod = load_inline("gpumem_torch_replay", cpp_sources=CPP, functions=["replay"],
                      with_cuda=True, extra_cflags=["-O2"], verbose=False)
    ops, starts, slots, streams, peak_live = read_trace(args.trace, args.split_passes)
    if not args.split_passes:
        starts = [i * len(ops) for i in range(args.passes)]
        ops = ops * args.passes
    torch.cuda.init()
    out = mod.replay(torch.tensor(ops, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64),
                     slots, streams)
    per_pass, reserved = out[:-1], out[-1]
    steady = per_pass[2:] or per_pass[-1:]
    print("RESULT " + json.dumps({
        "trace": os.path.basename(args.trace).removesuffix(".rmm.csv"), "allocator": "torch",
        "ops_per_pass": len(ops) // len(starts), "passes": len(per_pass), "ns_per_op": per_pass,
        "first": per_pass[0], "second": per_pass[1] if len(per_pass) > 1 else None,
        "steady": statistics.median(steady), "peak_live": peak_live, "peak_reserved": reserved,
        "reserved_over_live": reserved / peak_live if peak_live else None}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--split-passes", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per trace; medians reported")
    ap.add_argument("--out", default="torch_trace_replay.jsonl")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.trace = args.traces[0]
        return child(args)
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    command = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    print(f"{'trace':<24} {'first':>8} {'second':>8} {'steady':>8} {'res/live':>9}   (ns per op, torch)")
    failed = 0
    for trace in args.traces:
        cmd = [sys.executable, __file__, trace, "--child", "--passes", str(args.passes)]
        if args.split_passes:
            cmd.append("--split-passes")
        runs = []
        for _ in range(args.repeats):
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            got = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode != 0 or not got:
                print(f"{trace}: FAILED (exit {p.returncode})\n{(p.stdout + p.stderr)[-2000:]}")
                break
            runs.append(got[0])
        if len(runs) < args.repeats:
            failed += 1
            continue
        r = dict(runs[0], date=datetime.date.today().isoformat(), device=device, command=command,
                 repeats=len(runs))
        for k in ("first", "second", "steady", "peak_reserved", "reserved_over_live"):
            vals = [x[k] for x in runs if x[k] is not None]
            r[k] = statistics.median(vals) if vals else None
        r["ns_per_op"] = [statistics.median(x["ns_per_op"][i] for x in runs) for i in range(r["passes"])]
        with open(args.out, "a") as f:
            f.write(json.dumps(r) + "\n")
        second = r["second"] if r["second"] is not None else float("nan")
        print(f"{r['trace']:<24} {r['first']:>8.0f} {second:>8.0f} {r['steady']:>8.0f} "
              f"{r['reserved_over_live']:>9.3f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
