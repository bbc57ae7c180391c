# PyTorch's test_repeat_graph_capture_cublas_workspace_memory step by step
# (resource argv[1]; "torch" for PyTorch's allocator): device memory in use,
# reserved and segments every 20 captures.
import sys, torch
conf = sys.argv[1] if len(sys.argv) > 1 else "pool"
if conf != "torch":
    import gpumem.torch as gt
    gt.enable(mode="native", resource=conf)
torch.backends.cuda.preferred_blas_library("cublas")
a = torch.rand((1024, 512), device="cuda"); b = torch.rand((512, 64), device="cuda")
torch.mm(a, b)
free0, total = torch.cuda.mem_get_info()
def line(i):
    free, _ = torch.cuda.mem_get_info()
    s = torch.cuda.memory_stats()
    segs = torch.cuda.memory._snapshot()["segments"]
    print(f"{conf} after {i}: in use +{(free0 - free) / 1e6:.1f} MB, reserved {torch.cuda.memory_reserved() / 1e6:.1f} MB, "
          f"segments {len(segs)} (private {sum(1 for x in segs if tuple(x.get('segment_pool_id', (0, 0))) != (0, 0))}), "
          f"allocated {s.get('allocated_bytes.all.current', 0) / 1e6:.1f} MB", flush=True)
for i in range(100):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.mm(a, b)
    g.replay()
    if i % 20 == 19:
        line(i + 1)
