"""PyTorch's own allocator tests, run under PyTorch's allocator and under
gpumem, each test in its own process, and the differences listed.

    python3 python/conformance/run.py --test-file gpu-bundle/peer-tests/test_cuda.py \\
        --configs torch,native:pool,native:vpool --jobs 12 --out conformance

The test file is PyTorch's ``test/test_cuda.py`` (the project does not ship
it: scripts copy it from ../shared/peer-tests/pytorch, with its
``expecttest`` wheel). The classes run are those that test the caching
allocator's contract (``--classes``): TestCuda, TestCudaMallocAsync,
TestBlockStateAbsorption and TestMemPool.

Configurations: ``torch`` (PyTorch's caching allocator), ``MODE:RESOURCE``
(gpumem as PyTorch's allocator in mode ``native`` or ``pluggable``, with
``GPUMEM_CONF=resource=RESOURCE``; more GPUMEM_CONF settings after ``+``).

Every (test, configuration) pair runs as ``python -m pytest NODEID`` in a
fresh process (a CUDA error is sticky: it would fail every later test of
the process), ``--jobs`` at a time, spread over the GPUs of ``--gpus`` (one
visible to each process). With ``--batch N`` a process runs up to N tests
of one configuration, since importing PyTorch and collecting the file take
most of a process's time: a test that fails there (or whose process
crashed, or whose test before it left a sticky error) runs again alone,
below, so only a pass or a skip is ever taken from a shared process. The pairs are interleaved so that every
configuration sees the same load. Tests that ask for most of the GPU's
memory, or compare memory figures, can fail only because other processes
share the GPU: every pair that fails or errs is then run again alone on an
idle GPU, and that result is the one counted (both are kept).

Writes under ``--out``: ``results.jsonl`` (one line per pair: outcome
alone and in the crowd, seconds, the failure's last lines), ``summary.txt``
(passed/failed/skipped per configuration, then every test whose result
differs from ``torch``'s) and prints the summary last.
"""

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import queue
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
CLASSES = "TestCuda,TestCudaMallocAsync,TestBlockStateAbsorption,TestMemPool"
PASSING = ("passed", "skipped")


def collect(workdir, test_file, classes):
    """The node ids of every test of `classes` in `test_file`."""
    ids = [f"{os.path.basename(test_file)}::{c}" for c in classes.split(",")]
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
                       cwd=workdir, capture_output=True, text=True, timeout=600)
    got = [line.strip() for line in p.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if not got:
        raise SystemExit(f"collection found no tests (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    return got


def interleave(ids):
    """`ids` taken from each class in turn (a test of every class, then the
    next of each, ...), so that a deadline cuts every class a little rather
    than the last classes whole."""
    by_class = {}
    for i in ids:
        by_class.setdefault(i.split("::")[1], []).append(i)
    out = []
    for k in range(max(map(len, by_class.values()), default=0)):
        out += [tests[k] for tests in by_class.values() if k < len(tests)]
    return out


def config_env(config):
    """The environment of a test process of `config`."""
    env = dict(os.environ)
    for k in ("GPUMEM_CONFORMANCE", "GPUMEM_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env.pop(k, None)
    if config == "torch":
        return env
    mode, _, rest = config.partition(":")
    if mode not in ("native", "pluggable") or not rest:
        raise SystemExit(f"configuration {config!r}: expected torch, native:RESOURCE or pluggable:RESOURCE")
    resource, *extra = rest.split("+")
    env["GPUMEM_CONFORMANCE"] = mode
    env["GPUMEM_CONF"] = ",".join([f"resource={resource}", *extra])
    return env


def outcomes(xml_path):
    """{(class, test): (outcome, message)} of the tests in a JUnit XML
    report (empty when there is no readable report)."""
    try:
        cases = ET.parse(xml_path).getroot().iter("testcase")
    except (OSError, ET.ParseError):
        return {}
    got = {}
    for case in cases:
        key = (case.get("classname", "").rsplit(".", 1)[-1], case.get("name", ""))
        got[key] = ("passed", "")
        for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = case.find(tag)
            if el is not None:
                text = (el.get("message") or "") + "\n" + (el.text or "")
                got[key] = (name, text.strip()[-1500:])
                break
    return got


def run_batch(workdir, nodeids, config, gpu, timeout, logdir, until=None):
    """Runs `nodeids` (tests of one configuration) in one process; a list
    of (outcome, message, seconds), one per test, in order. The process
    gets `timeout` seconds per test, and is stopped at the time `until`
    (from time.time()) if that comes first: a hung test then costs the
    run's end, not the whole run."""
    first = nodeids[0].split("::", 1)[1]
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in f"{config}__{first}__{len(nodeids)}")
    xml = os.path.join(logdir, safe + ".xml")
    env = config_env(config)
    env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    t0 = time.time()
    limit = timeout * len(nodeids)
    if until is not None:
        limit = max(1, min(limit, int(until - t0)))
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                            *nodeids], cwd=workdir, env=env, capture_output=True, text=True, timeout=limit)
        out, rc, timed_out = p.stdout + p.stderr, p.returncode, False
    except subprocess.TimeoutExpired as e:
        out = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
        rc, timed_out = None, True
    got = outcomes(xml)
    each = (time.time() - t0) / len(nodeids)
    results = []
    for nodeid in nodeids:
        _, cls, name = nodeid.split("::")
        res, msg = got.get((cls, name), (None, ""))
        if res is None and timed_out:  # no report: the limit passed
            res, msg = "timeout", f"no result in {limit} s\n{out[-1500:]}"
        elif res is None:  # the process died before writing its report (a crash)
            res, msg = "crashed", f"exit {rc}\n{out[-1500:]}"
        elif res != "passed":
            msg = msg or out[-1500:]
        results.append((res, msg, each))
    return results




def selected(nodeid, select):
    """Whether a node id contains one of the '|'-separated texts of -k (all
    ids for an empty -k)."""
    return any(text in nodeid for text in select.split("|"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--test-file", required=True)
    ap.add_argument("--classes", default=CLASSES)
    ap.add_argument("--configs", default="torch,native:pool,native:vpool")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--gpus", default="0", help="comma list of GPU ordinals to spread the processes over")
    ap.add_argument("--timeout", type=int, default=300, help="seconds for one test")
    ap.add_argument("--deadline", type=int, default=0,
                    help="stop starting tests after this many seconds (0: none); the classes take turns, so a "
                         "deadline leaves some tests of every class unrun rather than whole classes")
    ap.add_argument("--alone-time", type=int, default=120,
                    help="seconds past the deadline for running failures again alone")
    ap.add_argument("--batch", type=int, default=1,
                    help="tests of one configuration per process in the crowd (failures run again alone)")
    ap.add_argument("-k", dest="select", default="",
                    help="only node ids containing one of these texts, separated by '|' "
                         "(for example 'memory|TestMemPool::')")
    ap.add_argument("--out", default="conformance")
    args = ap.parse_args()
    start = time.time()
    configs = args.configs.split(",")
    for c in configs:
        config_env(c)  # refuses a bad name before anything runs
    gpus = args.gpus.split(",")
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    logdir = os.path.join(args.out, "reports")
    os.makedirs(logdir, exist_ok=True)
    # The test file, with the conftest that installs gpumem beside it.
    workdir = os.path.join(args.out, "work")
    os.makedirs(workdir, exist_ok=True)
    shutil.copy(args.test_file, workdir)
    shutil.copy(os.path.join(HERE, "conftest.py"), workdir)
    ids = interleave([i for i in collect(workdir, args.test_file, args.classes) if selected(i, args.select)])
    print(f"conformance: {len(ids)} tests x {len(configs)} configurations, {args.jobs} at a time on GPUs {args.gpus}",
          flush=True)

    free_gpus = queue.Queue()
    per_gpu = max(1, args.jobs // len(gpus))
    for _ in range(per_gpu):
        for g in gpus:
            free_gpus.put(g)

    deadline = [args.deadline]

    def task(batch):
        nodeids, config = batch
        if deadline[0] and time.time() - start > deadline[0]:
            return batch, [("not run", "deadline", 0.0)] * len(nodeids)
        g = free_gpus.get()
        try:
            until = start + args.deadline + args.alone_time if args.deadline else None
            return batch, run_batch(workdir, nodeids, config, g, args.timeout, logdir, until)
        finally:
            free_gpus.put(g)

    size = max(1, args.batch)
    batches = [(ids[k:k + size], c) for k in range(0, len(ids), size) for c in configs]
    results = {}
    done = 0
    with cf.ThreadPoolExecutor(per_gpu * len(gpus)) as ex:
        for (nodeids, config), res in ex.map(task, batches):
            for nodeid, r in zip(nodeids, res):
                results[(nodeid, config)] = {"crowd": r}
            done, before = done + len(nodeids), done
            if done // 100 != before // 100:
                print(f"  {done}/{len(ids) * len(configs)} in {time.time() - start:.0f} s", flush=True)
    # Every failure again, alone on an idle GPU (one process per GPU).
    again = [p for p, r in results.items() if r["crowd"][0] not in PASSING + ("not run",)]
    print(f"conformance: {len(again)} failures run again alone ({time.time() - start:.0f} s so far)", flush=True)
    while not free_gpus.empty():
        free_gpus.get()
    for g in gpus:
        free_gpus.put(g)
    if args.deadline:
        deadline[0] = args.deadline + args.alone_time
    with cf.ThreadPoolExecutor(len(gpus)) as ex:
        for ([nodeid], config), [res] in ex.map(task, [([i], c) for i, c in again]):
            if res[0] != "not run":
                results[(nodeid, config)]["alone"] = res

    date = datetime.date.today().isoformat()
    with open(os.path.join(args.out, "results.jsonl"), "w") as f:
        for (nodeid, config), r in results.items():
            final = r.get("alone", r["crowd"])
            f.write(json.dumps({"bench": "torch_conformance", "date": date, "test": nodeid, "config": config,
                                "outcome": final[0], "message": final[1], "seconds": round(final[2], 1),
                                "crowd_outcome": r["crowd"][0], "ran_alone": "alone" in r}) + "\n")
    where = "each in its own process" if size == 1 else f"up to {size} per process, failures again alone"
    lines = [f"PyTorch's test_cuda.py ({args.classes}), {len(ids)} tests, {where}; {date}",
             f"{'configuration':<28} {'passed':>7} {'failed':>7} {'skipped':>8} {'other':>6}  (failed alone too / in the crowd)"]
    final = {p: r.get("alone", r["crowd"])[0] for p, r in results.items()}
    for c in configs:
        got = [final[(i, c)] for i in ids]
        crowd = sum(results[(i, c)]["crowd"][0] not in PASSING for i in ids)
        other = len(got) - got.count("passed") - got.count("failed") - got.count("skipped")
        lines.append(f"{c:<28} {got.count('passed'):>7} {got.count('failed'):>7} {got.count('skipped'):>8} "
                     f"{other:>6}  ({len(got) - got.count('passed') - got.count('skipped')} / {crowd})")
    base = configs[0]
    for c in configs[1:]:
        worse = [i for i in ids if final[(i, base)] in PASSING and final[(i, c)] not in PASSING]
        better = [i for i in ids if final[(i, base)] not in PASSING and final[(i, c)] in PASSING]
        lines.append(f"\n{c}: {len(worse)} tests pass or skip under {base} and not under {c}:")
        for i in worse:
            msg = results[(i, c)].get("alone", results[(i, c)]["crowd"])[1].strip().splitlines()
            lines.append(f"  {final[(i, c)]:<8} {i.split('::', 1)[1]}  | {(msg[-1] if msg else '')[:160]}")
        if better:
            lines.append(f"{c}: {len(better)} tests fail under {base} and pass or skip under {c}: "
                         + ", ".join(i.split("::", 1)[1] for i in better))
    lines.append(f"\nconformance: {time.time() - start:.0f} s in all")
    text = "\n".join(lines)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
