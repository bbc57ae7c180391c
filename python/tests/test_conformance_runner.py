"""python/conformance/run.py on a small stand-in for PyTorch's test file
(no GPU, no PyTorch): a shared process gives only passes and skips, and
every other outcome is the test's own, found again alone (a crash, a failure, a test
broken by the one before it in its process)."""

import json
import os
import subprocess
import sys

RUN = os.path.join(os.path.dirname(__file__), "..", "conformance", "run.py")

TESTS = '''
import os, unittest
BROKEN = []
class TestCuda(unittest.TestCase):
    def test_breaks_the_process(self): BROKEN.append(1); self.fail("a sticky error")
    def test_a(self): self.assertFalse(BROKEN)
    def test_b(self): self.assertFalse(BROKEN)
    def test_fails(self): self.assertEqual(1, 2)
    def test_crashes(self): os._exit(3)
    def test_c(self): self.assertFalse(BROKEN)
class TestMemPool(unittest.TestCase):
    def test_ok(self): self.assertFalse(BROKEN)
    def test_skips(self): self.skipTest("not here")
'''

EXPECTED = {
    "TestCuda::test_a": "passed", "TestCuda::test_breaks_the_process": "failed", "TestCuda::test_b": "passed",
    "TestCuda::test_fails": "failed", "TestCuda::test_crashes": "crashed", "TestCuda::test_c": "passed",
    "TestMemPool::test_ok": "passed", "TestMemPool::test_skips": "skipped",
}


def run(tmp_path, batch):
    src = tmp_path / "test_cuda.py"
    src.write_text(TESTS)
    out = tmp_path / f"out{batch}"
    subprocess.run([sys.executable, RUN, "--test-file", str(src), "--classes", "TestCuda,TestMemPool",
                    "--configs", "torch", "--jobs", "2", "--batch", str(batch), "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {r["test"].split("::", 1)[1]: r for r in rows}


def test_batches_give_each_test_its_own_outcome(tmp_path):
    # Batches of 3, the classes taking turns (unittest's tests in name
    # order): a, ok, b | skips, breaks, c | crashes, fails. The sticky
    # error fails test_c in its process, and the crash takes test_fails'
    # report with it; each gets its own result alone.
    got = run(tmp_path, 3)
    assert {t: r["outcome"] for t, r in got.items()} == EXPECTED
    assert got["TestCuda::test_c"]["crowd_outcome"] == "failed"
    assert got["TestCuda::test_fails"]["crowd_outcome"] == "crashed"
    for t, r in got.items():
        assert r["ran_alone"] == (r["crowd_outcome"] not in ("passed", "skipped")), t


def test_one_test_per_process_agrees(tmp_path):
    got = run(tmp_path, 1)
    assert {t: r["outcome"] for t, r in got.items()} == EXPECTED


def test_a_hung_test_stops_at_the_deadline(tmp_path):
    # The process of a test that never returns is stopped when the deadline
    # and the time for failures alone have passed, not after --timeout, so
    # one hung test cannot take the whole run (and its summary) with it.
    src = tmp_path / "test_cuda.py"
    src.write_text("import time, unittest\nclass TestCuda(unittest.TestCase):\n"
                   "    def test_hangs(self): time.sleep(3600)\n")
    out = tmp_path / "out"
    subprocess.run([sys.executable, RUN, "--test-file", str(src), "--classes", "TestCuda", "--configs", "torch",
                    "--jobs", "1", "--timeout", "3600", "--deadline", "15", "--alone-time", "1", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    [row] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["crowd_outcome"] == "timeout"
    assert "no result in" in row["message"]


def test_k_keeps_ids_containing_any_of_its_texts(tmp_path):
    src = tmp_path / "test_cuda.py"
    src.write_text(TESTS)
    out = tmp_path / "out"
    subprocess.run([sys.executable, RUN, "--test-file", str(src), "--classes", "TestCuda,TestMemPool",
                    "--configs", "torch", "--jobs", "2", "-k", "test_a|TestMemPool::test_ok", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["test"].split("::", 1)[1] for r in rows) == ["TestCuda::test_a", "TestMemPool::test_ok"]
