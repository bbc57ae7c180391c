# PyTorch's test_memory_plots, step by step, printing what each case's
# snapshot holds instead of asserting (under the allocator GPUMEM_CONF or
# gpumem.torch.enable's arguments name; "torch" for PyTorch's own).
import json, sys, torch
conf = sys.argv[1] if len(sys.argv) > 1 else "pool"
if conf != "torch":
    import gpumem.torch as gt
    res, *extra = conf.split("+")
    gt.enable(mode="native", resource=res, **dict(e.split("=", 1) for e in extra))
from torch.cuda._memory_viz import segment_plot, trace_plot

def where(obj, needle, path="", out=None):
    out = [] if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            where(v, needle, f"{path}.{k}", out)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            where(v, needle, f"{path}[{i}]", out)
    elif isinstance(obj, str) and needle in obj:
        out.append(path)
    return out

def test_memory_plots():
    for context, stacks in (("all", "all"), ("all", "python"), (None, "python")):
        torch.cuda.memory.empty_cache()
        torch.cuda.memory._record_memory_history("all", context=context, stacks=stacks)
        def run():
            x = torch.rand(128, 128, device="cuda")
            x * x + x * x
        run()
        ss = torch.cuda.memory._snapshot()
        trace_plot(ss); trace_plot(ss, filter_freed=True); segment_plot(ss)
        text = json.dumps(ss)
        hits = where(ss, "test_memory_plots")
        ok1 = (context is not None) == ("test_memory_plots" in text)
        ok2 = (stacks == "all") == ("::rand" in text)
        ok3 = str(128 * 128 * 4) in text
        print(f"{conf} context={context} stacks={stacks}: name-check {ok1} cpp-check {ok2} size-check {ok3}; "
              f"traces {[len(t) for t in ss['device_traces']]}, segments {len(ss['segments'])}, "
              f"name at {hits[:4]} ({len(hits)})", flush=True)
        if not ok1:
            for t in ss["device_traces"]:
                for e in t[:6]:
                    print("   ", {k: (v if k != "frames" else [f.get("name") for f in v][:8]) for k, v in e.items()})
        torch.cuda.memory._record_memory_history(None)

test_memory_plots()
