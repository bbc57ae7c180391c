"""Writes small pickles shaped like torch.cuda.memory._snapshot() output.

The real snapshot is a dict with 'segments' and 'device_traces' (one list of
event dicts per device). Events carry 'action', 'addr', 'size', 'stream',
'time_us' and 'frames'. torch's _dump_snapshot pickles with the default
protocol (4 on current Pythons); torch.save-era files use protocol 2; we also
write protocol 5. Run: python3 make_snapshot.py (writes snapshot_p{2,4,5}.pickle).
"""
import pickle

T0 = 1_763_744_400_000_000  # 2025-11-21T17:00:00Z in microseconds
S0, S1 = 0, 94_038_421_135_584  # the default stream and a side stream


def frame(name, line):
    return {"filename": "train.py", "line": line, "name": name}


def ev(action, addr, size, stream=S0, dt=0, **extra):
    d = {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": stream,
        "time_us": T0 + dt,
        "frames": [frame("forward", 10), frame("<module>", 99)],
    }
    d.update(extra)
    return d


A = 0x7F00_0000_0000
trace = [
    ev("segment_alloc", A, 20 << 20, dt=1),
    ev("alloc", A, 4096, dt=2),
    ev("alloc", A + 4096, 1 << 20, dt=3),
    ev("alloc", A + (2 << 20), 512, stream=S1, dt=4),
    ev("free_requested", A, 4096, dt=5),
    ev("free_completed", A, 4096, dt=6),
    ev("alloc", A, 2048, dt=7),  # pointer reused
    ev("oom", 0, 1 << 40, dt=8, device_free=123),
    ev("free_requested", A + (2 << 20), 512, stream=S1, dt=9),
    ev("free_completed", A + (2 << 20), 512, stream=S1, dt=12),
    ev("free_requested", A + 4096, 1 << 20, dt=13),
    ev("free_completed", A + 4096, 1 << 20, dt=13),
    ev("free_requested", A, 2048, dt=14),
    ev("free_completed", A, 2048, dt=14),
    ev("segment_free", A, 20 << 20, dt=15),
    ev("snapshot", 0, 0, dt=16),
]
snapshot = {
    "segments": [
        {
            "device": 0,
            "address": A,
            "total_size": 20 << 20,
            "allocated_size": 0,
            "active_size": 0,
            "requested_size": 0,
            "stream": S0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": [{"address": A, "size": 20 << 20, "requested_size": 0, "state": "inactive", "frames": []}],
        }
    ],
    "device_traces": [trace, []],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1, "garbage_collection_threshold": 0.0, "expandable_segments": False},
}

for proto in (2, 4, 5):
    with open(f"snapshot_p{proto}.pickle", "wb") as f:
        pickle.dump(snapshot, f, protocol=proto)
