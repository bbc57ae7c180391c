"""python/bench/torch_trace_replay.py without a GPU: the allocator names it
takes and how it reads a log into operations (the replay itself is C++
against PyTorch and libgpumem.so on a GPU)."""

import importlib.util
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench", "torch_trace_replay.py")


def load():
    spec = importlib.util.spec_from_file_location("torch_trace_replay", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_allocator_names_are_gpumem_conf_resources():
    mod = load()
    assert mod.gpumem_conf("torch") is None
    assert mod.gpumem_conf("default") == ""
    assert mod.gpumem_conf("vpool") == "resource=vpool"
    assert mod.gpumem_conf("pool+expandable=false+shards=1") == "resource=pool,expandable=false,shards=1"


def test_a_log_becomes_slots_streams_and_passes(tmp_path):
    # Two passes told apart by the pointer's bits 40 and up; the second
    # pass's cleanup free (thread 2) is not replayed; slots are reused.
    log = tmp_path / "t.rmm.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                   "1,0,allocate,0x10000000000,512,0x0\n"
                   "1,1,allocate,0x10000001000,256,0x7\n"
                   "1,2,free,0x10000000000,512,0x0\n"
                   "1,3,allocate,0x20000000000,1024,0x7\n"
                   "2,4,free,0x20000000000,1024,0x7\n")
    ops, starts, slots, streams, peak = load().read_trace(str(log), split=True)
    assert ops == [(0, 0, 512, 1), (1, 1, 256, 1), (0, 0, 512, 0), (0, 1, 1024, 1)]
    assert starts == [0, 3] and slots == 2 and streams == 2 and peak == 1280


def test_gpumem_allocators_need_the_library(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GPUMEM_LIB"}
    p = subprocess.run([sys.executable, BENCH, str(tmp_path / "x.csv"), "--allocators", "torch,vpool"],
                       capture_output=True, text=True, env=env)
    assert p.returncode != 0 and "need GPUMEM_LIB" in p.stderr
