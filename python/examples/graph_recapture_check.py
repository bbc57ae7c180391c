"""CUDA graphs that reuse memory across captures, under gpumem's native
allocator: the steps of PyTorch's test_graph_capture_reset_recapture (a
tensor allocated in a first capture, the graph reset, a second capture
that writes the tensor and frees it, the second graph replayed while new
allocations come and go), and two graphs sharing one pool. Meant to run
under compute-sanitizer's memcheck, which reports any access to memory
given back or handed to someone else:

    compute-sanitizer --tool memcheck python3 python/examples/graph_recapture_check.py

Prints "graph_recapture_check: ok" when every replay computed what eager
code computes.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import gpumem.torch  # noqa: E402

gpumem.torch.enable(mode="native", resource=os.environ.get("RESOURCE", "pool"))

s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    # A tensor allocated in a first capture; the graph is reset.
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, stream=s):
        x = torch.zeros(1 << 20, device="cuda")
    g1.reset()
    # A second capture writes it and frees it.
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, stream=s):
        x.fill_(7.0)
        y = x * 2
        del x
    # New allocations while g2 may write x's memory on every replay.
    others = [torch.full((1 << 20,), float(i), device="cuda") for i in range(8)]
    for _ in range(20):
        g2.replay()
    torch.cuda.synchronize()
    assert torch.all(y == 14.0), "the second graph's output"
    for i, o in enumerate(others):
        assert torch.all(o == float(i)), "memory handed out again was overwritten"

    # Two graphs in one pool, replayed in capture order.
    pool = torch.cuda.graph_pool_handle()
    a = torch.ones(1 << 18, device="cuda")
    ga, gb = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(ga, pool=pool, stream=s):
        t = a * 3
        u = t + 1
        del t
    with torch.cuda.graph(gb, pool=pool, stream=s):
        v = u * 2
    for k in range(1, 6):
        a.fill_(float(k))
        ga.replay()
        gb.replay()
        torch.cuda.synchronize()
        assert torch.all(v == (3.0 * k + 1) * 2), "shared-pool graphs"
    del g2, ga, gb, y, u, v, others
    torch.cuda.synchronize()
print("graph_recapture_check: ok")
