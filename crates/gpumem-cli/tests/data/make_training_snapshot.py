"""Writes training_snapshot.pickle: a synthetic memory snapshot shaped like
torch.cuda.memory._dump_snapshot() output with _record_memory_history
stacks, for `gpumem view`'s tests and its guide's screenshot.

No GPU made it: a toy model's training loop (parameters, activations kept
for backward, gradients, optimizer state, a side stream's input copies) is
served by a small model of PyTorch's caching allocator: requests rounded to
512 bytes; those up to 1 MiB from 2 MiB segments, those up to 10 MiB from
20 MiB segments, larger ones from segments of their size rounded to 2 MiB;
best fit among the free blocks of a pool, split, merged with free
neighbours on free; segments kept until the end (no empty_cache). The trace
has the events PyTorch records (segment_alloc, alloc, free_requested,
free_completed) with time_us, stream and frames; the snapshot lists the
segments at its end with their blocks. Deterministic: run
`python3 make_training_snapshot.py` here to write the same file again.
"""
import pickle
import random

MIB = 1 << 20
BASE = 0x7F3A_0000_0000
MAIN, SIDE = 0, 94_038_421_135_584
T0 = 1_763_744_400_000_000

rng = random.Random(7)
trace = []
clock = [T0]
segments = []  # dicts: address, size, pool ('small'/'large'), stream, free: [(addr, size)]
next_addr = [BASE]
live = {}  # addr -> (size, stream, segment index, frames)


def frame(name, filename, line):
    return {"filename": filename, "line": line, "name": name}


def event(action, addr, size, stream, frames):
    clock[0] += rng.randint(3, 40)
    trace.append({
        "action": action, "addr": addr, "size": size, "stream": stream,
        # One list per stack, shared by every event with that stack, as
        # PyTorch writes them: each later use pickles as a memo reference.
        "time_us": clock[0], "frames": frames,
    })


def round_size(n):
    return max(512, (n + 511) // 512 * 512)


def segment_size(n):
    if n <= MIB:
        return 2 * MIB, "small"
    if n <= 10 * MIB:
        return 20 * MIB, "large"
    return (n + 2 * MIB - 1) // (2 * MIB) * (2 * MIB), "large"


def malloc(n, frames, stream=MAIN):
    n = round_size(n)
    seg_bytes, pool = segment_size(n)
    best = None
    for si, s in enumerate(segments):
        if s["pool"] != pool or s["stream"] != stream:
            continue
        for fi, (a, sz) in enumerate(s["free"]):
            if sz >= n and (best is None or sz < best[2]):
                best = (si, fi, sz)
    if best is None:
        addr = next_addr[0]
        next_addr[0] += seg_bytes + 2 * MIB  # segments are not adjacent
        segments.append({"address": addr, "size": seg_bytes, "pool": pool, "stream": stream,
                         "free": [(addr, seg_bytes)], "frames": frames})
        event("segment_alloc", addr, seg_bytes, stream, frames)
        best = (len(segments) - 1, 0, seg_bytes)
    si, fi, sz = best
    s = segments[si]
    a, _ = s["free"].pop(fi)
    if sz > n:
        s["free"].append((a + n, sz - n))
        s["free"].sort()
    live[a] = (n, stream, si, frames)
    event("alloc", a, n, stream, frames)
    return a


def free(a):
    n, stream, si, frames = live.pop(a)
    event("free_requested", a, n, stream, frames)
    s = segments[si]
    s["free"].append((a, n))
    s["free"].sort()
    merged = []
    for fa, fs in s["free"]:
        if merged and merged[-1][0] + merged[-1][1] == fa:
            merged[-1] = (merged[-1][0], merged[-1][1] + fs)
        else:
            merged.append((fa, fs))
    s["free"] = merged
    event("free_completed", a, n, stream, frames)


FRAMES, STACKS = {}, {}


def stack(*frames):
    """The one list for these frames, built from the one dict per frame, as
    PyTorch shares them between the events and blocks of a snapshot."""
    frames = frames + (("<module>", "train.py", 120),)
    if frames not in STACKS:
        STACKS[frames] = [FRAMES.setdefault(f, frame(*f)) for f in frames]
    return STACKS[frames]


LAYERS = 12
params = [malloc(rng.choice([4, 9, 16, 36]) * MIB + rng.randint(0, 4096),
                 stack(("__init__", "model.py", 30 + i), ("build_model", "train.py", 41)))
          for i in range(LAYERS)]
opt_state = []
for it in range(4):
    batch = rng.choice([0.7, 1.0, 1.3])
    inputs = malloc(int(24 * MIB * batch), stack(("load_batch", "data.py", 77), ("train_step", "train.py", 88)), SIDE)
    acts = []
    for layer in range(LAYERS):
        size = int(rng.choice([6, 12, 18, 30]) * MIB * batch)
        acts.append(malloc(size, stack(("forward", "model.py", 60 + layer), ("train_step", "train.py", 90))))
        for _ in range(3):
            tmp = malloc(rng.randint(4096, 600_000), stack(("gelu", "model.py", 52), ("forward", "model.py", 60 + layer), ("train_step", "train.py", 90)))
            free(tmp)
    free(inputs)
    grads = []
    for layer in reversed(range(LAYERS)):
        g = malloc(rng.randint(2, 20) * MIB, stack(("backward", "autograd.py", 200), ("train_step", "train.py", 94)))
        grads.append(g)
        free(acts.pop())
        for _ in range(2):
            tmp = malloc(rng.randint(1024, 300_000), stack(("backward", "autograd.py", 211), ("train_step", "train.py", 94)))
            free(tmp)
    if not opt_state:
        opt_state = [malloc(rng.choice([4, 9, 16, 36]) * MIB * 2, stack(("step", "optim.py", 140), ("train_step", "train.py", 97)))
                     for _ in range(LAYERS)]
    for g in grads:
        free(g)
event("snapshot", 0, 0, MAIN, [])


def segment_entry(s):
    blocks = []
    spans = [(a, n, "active_allocated") for a, (n, _, si, _) in live.items() if segments[si] is s]
    spans += [(a, n, "inactive") for a, n in s["free"]]
    for a, n, state in sorted(spans):
        blocks.append({"address": a, "size": n, "requested_size": n, "state": state, "frames": []})
    allocated = sum(n for _, n, st in spans if st == "active_allocated")
    return {
        "device": 0, "address": s["address"], "total_size": s["size"],
        "allocated_size": allocated, "active_size": allocated, "requested_size": allocated,
        "stream": s["stream"], "segment_type": s["pool"], "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": s["frames"], "blocks": blocks,
    }


snapshot = {
    "segments": [segment_entry(s) for s in segments],
    "device_traces": [trace],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                           "garbage_collection_threshold": 0.0, "expandable_segments": False},
}
with open("training_snapshot.pickle", "wb") as f:
    pickle.dump(snapshot, f, protocol=4)
print(f"training_snapshot.pickle: {len(trace)} events, {len(segments)} segments")
