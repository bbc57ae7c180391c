"""python/bench/real_jobs.py without a GPU: its command line and how it
turns rounds into the table's numbers (the jobs themselves need PyTorch and
a GPU)."""

import importlib.util
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench", "real_jobs.py")


def load():
    spec = importlib.util.spec_from_file_location("real_jobs", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def result(job, config, rnd, s, loss=1.0):
    return {"job": job, "config": config, "round": rnd, "s_per_step": s, "first3_s": 3 * s,
            "losses": [2.0, loss], "peak_reserved": 10 + rnd, "peak_allocated": 8, "peak_in_use": 12}


def test_list_names_every_job_and_configuration():
    out = subprocess.run([sys.executable, BENCH, "list"], capture_output=True, text=True, check=True).stdout
    mod = load()
    for name in mod.JOBS + mod.CONFIGS:
        assert name in out


def test_unknown_jobs_are_refused_before_anything_runs():
    p = subprocess.run([sys.executable, BENCH, "run", "--jobs", "lm,nope"], capture_output=True, text=True)
    assert p.returncode != 0 and "unknown jobs ['nope']" in p.stderr


def test_ratios_pair_each_round_with_the_baseline_s_own():
    mod = load()
    got = {
        ("lm", "torch"): [result("lm", "torch", 0, 1.0), result("lm", "torch", 1, 2.0)],
        ("lm", "native:pool"): [result("lm", "native:pool", 0, 1.1), result("lm", "native:pool", 1, 1.8)],
        ("lm", "native:vpool"): [result("lm", "native:vpool", 1, 2.2, loss=0.5)],
    }
    rows = {r["config"]: r for r in mod.summarize(got, ["lm"], ["torch", "native:pool", "native:vpool"], "torch")}
    pool = rows["native:pool"]
    assert pool["vs_base_rounds"] == pytest.approx([1.1, 0.9])
    assert pool["vs_base"] == pytest.approx(1.0)
    assert pool["s_per_step"] == pytest.approx(1.45)
    assert pool["peak_reserved"] == 11 and pool["same_losses_every_round"]
    # Leanness against the baseline's peak allocated (8), and the first
    # three steps paired by round (3.3 s against 3 and 5.4 against 6).
    assert pool["reserved_vs_base_allocated"] == pytest.approx(11 / 8)
    assert pool["first3_vs_base"] == pytest.approx(1.0)
    vpool = rows["native:vpool"]
    assert vpool["rounds_ok"] == 1 and vpool["vs_base_rounds"] == pytest.approx([1.1])
    assert vpool["final_loss"] == 0.5
    assert rows["torch"]["vs_base"] == pytest.approx(1.0)


def test_a_configuration_that_never_ran_is_a_failed_row():
    mod = load()
    got = {("gnn", "torch"): [result("gnn", "torch", 0, 1.0)], ("gnn", "native:pool"): []}
    rows = mod.summarize(got, ["gnn"], ["torch", "native:pool"], "torch")
    assert rows[1] == {"job": "gnn", "config": "native:pool", "rounds_ok": 0}
    mod.print_table(rows, "torch")  # prints "failed" for it, without raising


def test_several_gpus_share_the_rounds_and_the_deadline_stops_new_processes(tmp_path, monkeypatch):
    # The children are stood in for: each runs every job it is given and
    # reports the GPU it was given, so the test sees one process per
    # (round, configuration) with every job in it, on the GPUs named; then
    # a deadline already past runs nothing.
    mod = load()
    seen, lock = [], __import__("threading").Lock()

    class Done:
        def __init__(self, out, rc=0):
            self.returncode, self.stdout, self.stderr = rc, out, ""

    def fake_run(cmd, env=None, **kw):
        if "-c" in cmd:
            return Done("Fake GPU\n")
        gpu, jobs, config = env["CUDA_VISIBLE_DEVICES"], cmd[cmd.index("--jobs") + 1], cmd[cmd.index("--config") + 1]
        with lock:
            seen.append((jobs, config, gpu))
        out = ""
        for job in jobs.split(","):
            res = {"job": job, "config": config, "first3_s": 0.3, "s_per_step": 0.1, "losses": [1.0],
                   "peak_reserved": 2, "peak_allocated": 1, "peak_in_use": 3}
            out += "RESULT " + __import__("json").dumps(res) + "\n"
        return Done(out)

    monkeypatch.setattr(mod.subprocess, "run", fake_run)
    out = tmp_path / "r.jsonl"
    rc = mod.main(["run", "--jobs", "lm,gnn", "--configs", "torch,native:pool", "--rounds", "2",
                   "--gpus", "0,1", "--out", str(out)])
    assert rc == 0
    assert sorted((j, c) for j, c, _ in seen) == sorted([("lm,gnn", c) for c in ("torch", "native:pool")] * 2)
    assert {g for _, _, g in seen} <= {"0", "1"}
    rows = [__import__("json").loads(line) for line in out.read_text().splitlines()]
    assert {(r["job"], r["config"], r["rounds_ok"]) for r in rows} == {
        (j, c, 2) for j in ("lm", "gnn") for c in ("torch", "native:pool")}
    seen.clear()
    monkeypatch.setattr(mod.time, "time", iter([0.0] + [100.0] * 100).__next__)
    rc = mod.main(["run", "--jobs", "lm", "--configs", "torch", "--rounds", "1", "--deadline", "10",
                   "--out", str(out)])
    assert rc == 1 and seen == []


def test_a_process_that_dies_midway_keeps_the_jobs_it_finished(tmp_path, monkeypatch):
    mod = load()

    class Done:
        returncode, stderr = 1, "Segmentation fault"
        stdout = "RESULT " + __import__("json").dumps(
            {"job": "lm", "config": "native:pool", "first3_s": 0.3, "s_per_step": 0.1, "losses": [1.0],
             "peak_reserved": 2, "peak_allocated": 1, "peak_in_use": 3}) + "\n"

    monkeypatch.setattr(mod.subprocess, "run", lambda cmd, **kw: Done())
    out = tmp_path / "r.jsonl"
    rc = mod.main(["run", "--jobs", "lm,gnn", "--configs", "native:pool", "--rounds", "1", "--out", str(out)])
    rows = {r["job"]: r for r in map(__import__("json").loads, out.read_text().splitlines())}
    assert rc == 1 and rows["lm"]["rounds_ok"] == 1 and rows["gnn"]["rounds_ok"] == 0


def test_rounds_split_over_calls_make_one_table(tmp_path, monkeypatch, capsys):
    # Two calls, rounds 0 and 1, keep every job's result; `table` pairs
    # them by round as one run would.
    mod = load()

    class Done:
        returncode, stderr = 0, ""

        def __init__(self, out):
            self.stdout = out

    def fake_run(cmd, env=None, **kw):
        if "-c" in cmd:
            return Done("Fake GPU\n")
        config = cmd[cmd.index("--config") + 1]
        s = 0.2 if config == "torch" else 0.22
        res = {"job": "lm", "config": config, "first3_s": 0.9, "s_per_step": s, "losses": [1.0],
               "peak_reserved": 2, "peak_allocated": 1, "peak_in_use": 3, "driver_calls_per_step": 0.5}
        if config == "native:vpool":
            res["mapping_changes_per_step"] = 41.0
        return Done("RESULT " + __import__("json").dumps(res) + "\n")

    monkeypatch.setattr(mod.subprocess, "run", fake_run)
    out = tmp_path / "r.jsonl"
    for first in (0, 1):
        assert mod.main(["run", "--jobs", "lm", "--configs", "torch,native:vpool", "--rounds", "1",
                         "--first-round", str(first), "--out", str(out)]) == 0
    raw = tmp_path / "r.raw.jsonl"
    kept = [__import__("json").loads(line) for line in raw.read_text().splitlines()]
    assert sorted((r["config"], r["round"]) for r in kept) == [("native:vpool", 0), ("native:vpool", 1),
                                                               ("torch", 0), ("torch", 1)]
    capsys.readouterr()
    assert mod.main(["table", str(raw), "--configs", "torch,native:vpool"]) == 0
    table = capsys.readouterr().out
    assert "| lm | native:vpool | 0.2200 | 1.100 (1.100-1.100) |" in table
    # vpool's mapping changes per step; "-" for PyTorch's allocator, which
    # has none.
    assert "| 0.5 | 41.0 | 1.0000 |" in table and "| 0.5 | - | 1.0000 |" in table
