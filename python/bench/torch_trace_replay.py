"""PyTorch's caching allocator and gpumem's C ABI on the workloads ``gpumem
bench`` runs, driven from one C++ loop: PyTorch's through
``c10::cuda::CUDACachingAllocator::raw_alloc_with_stream`` and
``raw_delete``, gpumem's through ``gpumem_malloc`` and ``gpumem_free`` of
libgpumem.so (``GPUMEM_LIB``), as PyTorch's native mode calls them. No
tensors, no Python per operation, the same streams: their first, second
and steady passes stand in one table.

    python3 python/bench/torch_trace_replay.py gpt2_train.rmm.csv resnet50_train.rmm.csv \\
        --passes 6 --allocators torch,default,vpool --out results.jsonl
    python3 python/bench/torch_trace_replay.py iter_1.0.rmm.csv --split-passes --out results.jsonl

Allocators: ``torch`` (PyTorch's caching allocator), ``default`` (gpumem
with ``GPUMEM_CONF`` unset) and gpumem resources by their ``GPUMEM_CONF``
name, with more settings after ``+`` (``pool+expandable=false`` is
``GPUMEM_CONF=resource=pool,expandable=false``).

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
#include <dlfcn.h>
#include <stdexcept>
#include <string>
#include <vector>

namespace alloc = c10::cuda::CUDACachingAllocator;

// The allocator a replay runs through: PyTorch's caching allocator, or
// gpumem's C ABI (libgpumem.so, loaded by path, configured by GPUMEM_CONF).
struct Target {
  void* (*g_malloc)(ssize_t, int, void*) = nullptr;
  void (*g_free)(void*, ssize_t, int, void*) = nullptr;
  size_t (*g_peak_reserved)(int) = nullptr;

  explicit Target(const std::string& lib) {
    if (lib.empty()) return;
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!h) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    g_malloc = reinterpret_cast<void* (*)(ssize_t, int, void*)>(dlsym(h, "gpumem_malloc"));
    g_free = reinterpret_cast<void (*)(void*, ssize_t, int, void*)>(dlsym(h, "gpumem_free"));
    g_peak_reserved = reinterpret_cast<size_t (*)(int)>(dlsym(h, "gpumem_peak_reserved_bytes"));
    if (!g_malloc || !g_free || !g_peak_reserved) throw std::runtime_error("libgpumem lacks the C ABI");
  }
  void* malloc(int64_t size, int device, cudaStream_t s) const {
    if (g_malloc) return g_malloc(size, device, s);
    return alloc::raw_alloc_with_stream(size, s);
  }
  void free(void* p, int64_t size, int device, cudaStream_t s) const {
    if (g_free) return g_free(p, size, device, s);
    alloc::raw_delete(p);
  }
  double peak_reserved(int device) const {
    if (g_peak_reserved) return double(g_peak_reserved(device));
    return double(alloc::getDeviceStats(device).reserved_bytes[0].peak);
  }
};

// ops: int64 [n, 4] (slot, stream, size, alloc); starts: the first op of
// each pass; lib: libgpumem.so's path, or "" for PyTorch's allocator.
// Returns ns per op of each pass, then the peak reserved bytes.
std::vector<double> replay(torch::Tensor ops, torch::Tensor starts, int64_t slots, int64_t streams,
                           std::string lib) {
  Target target(lib);
  auto o = ops.accessor<int64_t, 2>();
  auto s = starts.accessor<int64_t, 1>();
  int device = c10::cuda::current_device();
  std::vector<c10::cuda::CUDAStream> st;
  st.push_back(c10::cuda::getDefaultCUDAStream(device));
  for (int64_t i = 1; i < streams; i++) st.push_back(c10::cuda::getStreamFromPool(false, device));
  std::vector<void*> ptr(slots, nullptr);
  std::vector<int64_t> size_of(slots, 0), stream_of(slots, 0);
  std::vector<double> out;
  int64_t n = ops.size(0), passes = starts.size(0);
  alloc::resetPeakStats(device);
  for (int64_t p = 0; p < passes; p++) {
    int64_t a = s[p], b = p + 1 < passes ? s[p + 1] : n;
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = a; i < b; i++) {
      int64_t slot = o[i][0];
      if (o[i][3]) {
        ptr[slot] = target.malloc(o[i][2], device, st[o[i][1]].stream());
        if (!ptr[slot]) throw std::runtime_error("allocation of " + std::to_string(o[i][2]) + " bytes failed");
        size_of[slot] = o[i][2];
        stream_of[slot] = o[i][1];
      } else {
        target.free(ptr[slot], size_of[slot], device, st[stream_of[slot]].stream());
        ptr[slot] = nullptr;
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    out.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / double(b - a));
    for (int64_t k = 0; k < slots; k++) {
      if (ptr[k]) { target.free(ptr[k], size_of[k], device, st[stream_of[k]].stream()); ptr[k] = nullptr; }
    }
  }
  out.push_back(target.peak_reserved(device));
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


def gpumem_conf(allocator):
    """GPUMEM_CONF for an allocator's name; None for PyTorch's."""
    if allocator == "torch":
        return None
    if allocator == "default":
        return ""
    resource, *settings = allocator.split("+")
    return ",".join([f"resource={resource}"] + settings)


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
    lib = "" if args.allocator == "torch" else os.environ["GPUMEM_LIB"]
    out = mod.replay(torch.tensor(ops, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64),
                     slots, streams, lib)
    per_pass, reserved = out[:-1], out[-1]
    steady = per_pass[2:] or per_pass[-1:]
    print("RESULT " + json.dumps({
        "trace": os.path.basename(args.trace).removesuffix(".rmm.csv"), "allocator": args.allocator,
        "ops_per_pass": len(ops) // len(starts), "passes": len(per_pass), "ns_per_op": per_pass,
        "first": per_pass[0], "second": per_pass[1] if len(per_pass) > 1 else None,
        "steady": statistics.median(steady), "peak_live": peak_live, "peak_reserved": reserved,
        "reserved_over_live": reserved / peak_live if peak_live else None}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--split-passes", action="store_true")
    ap.add_argument("--repeats", type=int, default=3,
                    help="fresh processes per trace and allocator, the allocators in turn; medians reported")
    ap.add_argument("--allocators", default="torch",
                    help="comma list: torch, default, or GPUMEM_CONF resources (pool, vpool+SETTING=V, ...)")
    ap.add_argument("--allocator", default="torch", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="torch_trace_replay.jsonl")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.trace = args.traces[0]
        return child(args)
    allocators = args.allocators.split(",")
    if any(a != "torch" for a in allocators) and not os.environ.get("GPUMEM_LIB"):
        sys.exit("gpumem allocators need GPUMEM_LIB, the path of libgpumem.so")
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    command = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    print(f"{'trace':<24} {'allocator':<16} {'first':>8} {'second':>8} {'steady':>8} {'res/live':>9}   (ns per op)")
    failed = 0
    for trace in args.traces:
        runs = {a: [] for a in allocators}
        for rep in range(args.repeats):
            # The allocators in turn, rotated each repeat: the host's drift
            # hits them alike.
            for allocator in allocators[rep % len(allocators):] + allocators[:rep % len(allocators)]:
                cmd = [sys.executable, __file__, trace, "--child", "--passes", str(args.passes),
                       "--allocator", allocator]
                if args.split_passes:
                    cmd.append("--split-passes")
                env = dict(os.environ)
                env.pop("GPUMEM_CONF", None)
                conf = gpumem_conf(allocator)
                if conf:
                    env["GPUMEM_CONF"] = conf
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
                got = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
                if p.returncode != 0 or not got:
                    print(f"{trace} {allocator}: FAILED (exit {p.returncode})\n{(p.stdout + p.stderr)[-2000:]}")
                    continue
                runs[allocator].append(got[0])
        for allocator in allocators:
            rs = runs[allocator]
            if len(rs) < args.repeats:
                failed += 1
                continue
            r = dict(rs[0], date=datetime.date.today().isoformat(), device=device, command=command,
                     repeats=len(rs), gpumem_conf=gpumem_conf(allocator))
            for k in ("first", "second", "steady", "peak_reserved", "reserved_over_live"):
                vals = [x[k] for x in rs if x[k] is not None]
                r[k] = statistics.median(vals) if vals else None
            r["ns_per_op"] = [statistics.median(x["ns_per_op"][i] for x in rs) for i in range(r["passes"])]
            r["steady_spread"] = [min(x["steady"] for x in rs), max(x["steady"] for x in rs)]
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
            second = r["second"] if r["second"] is not None else float("nan")
            print(f"{r['trace']:<24} {allocator:<16} {r['first']:>8.0f} {second:>8.0f} {r['steady']:>8.0f} "
                  f"{r['reserved_over_live']:>9.3f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
