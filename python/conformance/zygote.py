"""The process the conformance runner forks its test processes from.

    python3 zygote.py '["pytest", "torch", ...]'

It imports the modules named (the test file's imports), checking after each
that a process forked from it could still initialize CUDA: PyTorch marks a
fork "bad" once CUDA was touched, and a module that does so at import time
would make every forked test fail. Such a module is named on stdout and the
process stops; the runner starts it again with the modules imported before
that one. Then it prints ``{"ready": [modules]}`` and serves, one JSON
object per line:

- on stdin, ``{"id": N, "workdir": ..., "nodeid": ..., "env": {...},
  "xml": ..., "log": ...}``: forks a process that runs pytest on the node
  id (``nodeid`` null: a check that CUDA works there);
- on stdout, ``{"id": N, "pid": P}`` once forked, then ``{"id": N,
  "exit": CODE}`` once it ended (negative: killed by that signal).

Each forked process starts its own session, so that the runner can kill it
with everything it started.
"""

import importlib
import json
import os
import select
import sys


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def fork_is_bad():
    """Whether a child forked now finds CUDA poisoned by this process."""
    pid = os.fork()
    if pid == 0:
        import torch

        os._exit(3 if torch._C._cuda_isInBadFork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 3


def child(req):
    """The body of a forked process: never returns."""
    code = 1
    try:
        os.setsid()
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["workdir"])
        if req["nodeid"] is None:
            import torch

            x = torch.ones(4, device="cuda")
            print("forked GPU check:", float(x.sum()), flush=True)
            code = 0 if float(x.sum()) == 4.0 else 1
        else:
            import pytest

            code = int(pytest.main(["-q", "-p", "no:cacheprovider", f"--junitxml={req['xml']}", req["nodeid"]]))
    except BaseException as e:  # noqa: BLE001 (whatever happens, the process must end here)
        print(f"forked process: {e!r}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve():
    children = {}
    stdin_open = True
    while stdin_open or children:
        ready, _, _ = select.select([sys.stdin] if stdin_open else [], [], [], 0.05)
        if ready:
            line = sys.stdin.readline()
            if not line:
                stdin_open = False
            else:
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    child(req)
                children[pid] = req["id"]
                say({"id": req["id"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            say({"id": children.pop(pid), "exit": os.waitstatus_to_exitcode(status)})


def main():
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    loaded = []
    for name in json.loads(sys.argv[1]):
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 (the test imports it again and reports it)
            say({"not_imported": name, "why": repr(e)[:300]})
            continue
        if "torch" in sys.modules and fork_is_bad():
            say({"poisoned_by": name, "after": loaded})
            return 3
        loaded.append(name)
    say({"ready": loaded})
    serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
