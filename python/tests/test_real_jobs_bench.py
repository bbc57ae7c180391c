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
