"""MemPool mode and CUDA IPC: a tensor allocated in a gpumem MemPool is sent
to a child process (torch.multiprocessing, spawn); the child checks the data."""
import json, os, sys
import torch
import torch.multiprocessing as mp

def child(q, r):
    t = q.get()
    r.put({"sum": float(t.double().sum().item()), "first": float(t[0].item()), "last": float(t[-1].item())})

def main():
    exp = sys.argv[1]
    import gpumem.torch as gt
    pool = gt.mempool(resource="pool", expandable=(exp == "true"))
    out = {"expandable": exp}
    with torch.cuda.use_mem_pool(pool):
        pad = torch.zeros(3 << 18, device="cuda")  # the tensor does not start its segment... maybe
        x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    want = float(x.double().sum().item())
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, r))
    p.start()
    try:
        q.put(x)
        got = r.get(timeout=60)
        out.update(got)
        out["ok"] = got["sum"] == want and got["last"] == float((1 << 20) - 1)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    p.join(30)
    if p.is_alive():
        p.kill()
    out["child_rc"] = p.exitcode
    out["want"] = want
    print("RESULT " + json.dumps(out), flush=True)

if __name__ == "__main__":
    main()
