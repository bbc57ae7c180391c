# PyTorch's test_graph_capture_reclaim_2_streams step by step under gpumem's
# native allocator (resource argv[1], default pool): the addresses, and
# whether gpumem sees the setting (gpumem_set_graph_capture_reuse returns
# the value it had).
import ctypes, os, sys, torch
import gpumem.torch as gt
gt.enable(mode="native", resource=sys.argv[1] if len(sys.argv) > 1 else "pool")
lib = ctypes.CDLL(os.environ["GPUMEM_LIB"])
torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
torch.cuda.empty_cache()
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
g = torch.cuda.CUDAGraph(keep_graph=True)
torch.cuda.synchronize()
with torch.cuda.stream(s1):
    g.capture_begin()
    sink1 = torch.empty(8, device="cuda")
    data1 = torch.empty(8, device="cuda"); p1 = data1.data_ptr()
    s2.wait_stream(s1)
    with torch.cuda.stream(s2):
        buf2 = torch.empty_like(data1)
        torch.add(data1, 2.0, out=buf2)
        data1.record_stream(s2)
    del data1
    data2 = torch.empty(8, device="cuda"); p2 = data2.data_ptr()
    s1.wait_stream(s2)
    sink1.fill_(1.0)
    data3 = torch.empty(8, device="cuda"); p3 = data3.data_ptr()
    g.capture_end()
torch.cuda.synchronize()
on = lib.gpumem_set_graph_capture_reuse(1)
print(f"reuse setting seen by gpumem: {on}; sink1 {sink1.data_ptr() - p1:+d}, buf2 {buf2.data_ptr() - p1:+d}, "
      f"data2 {p2 - p1:+d}, data3 {p3 - p1:+d} (from data1); reused after the join: {p1 == p3}", flush=True)
