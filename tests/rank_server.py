"""A process that imports torch and the trainer once, then forks the ranks of every launch.

A torchrun launch pays, before its first step, for its agent importing torch (~2.5 s on a
2-core Xeon) and for every rank importing torch and the trainer (~3.6 s each, all ranks sharing
the 2 cores: ~7 s for 4 ranks, ~15 s for 8), and ~1.7 s after its last; the suite launches
about 45 times. This server (started by ``tests/harness.py`` at a session's first launch) pays
the imports once: for each launch it forks a supervisor, which forks ``nproc`` ranks from the
already imported interpreter and runs the worker in each as torchrun would (``__main__``,
``sys.argv``, ``sys.path[0]``, the rank's environment, the rendezvous store bound by the
supervisor before the ranks look for it, a normal interpreter exit), then waits for them. What
the ranks run is unchanged: the same worker, the same trainer, the same process group; only
their start is cheaper. docs/testing.md says which tests still need torchrun itself.

Numerics. A forked rank must compute what a torchrun rank computes, so the fork copies nothing
that changes arithmetic:
- no thread: before every fork the server checks that it runs one thread and no process group
  (imports only), and refuses to serve otherwise; gloo, the store's clients and the process
  group are created by each rank after the fork, as under torchrun;
- the same environment: the server runs with the environment of the launches it serves (the
  harness starts a new server when that changes), because the OpenMP runtime, oneDNN
  (``ONEDNN_MAX_CPU_ISA``), ATen (``ATEN_CPU_CAPABILITY``) and inductor read theirs once, at
  import or at their first kernel; each rank still sets its intra-op thread count from its own
  ``OMP_NUM_THREADS`` (one, from ``launch.worker_env``) before running the worker.

Failures and ends. The first rank to fail is reported as torchrun reports it (its rank, exit
code or signal and pid on stderr; exit code 1); the other ranks get SIGTERM, then SIGKILL after
``GRACE_S``, as torchrun's agent stops them. Nothing outlives its owner: each launch is one
process group (the supervisor leads it; the server kills what is left of it after the launch
and the harness kills it on a timeout), ranks die with their supervisor, supervisors with the
server and the server with the test process (``PR_SET_PDEATHSIG``), and EOF on stdin ends the
server.

Protocol: one JSON request per line on stdin ({"nproc", "argv", "env", "cwd", "stdout",
"stderr"}), answered by {"pid": the supervisor's} at once and {"returncode": ...} when the
launch ends.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback

PRELOAD = (
    "torch",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torch.distributed.pipelining",
    "torch.distributed.tensor.parallel",
    "torchtitan_like.train",
    "torchtitan_like.validate",
    "torchtitan_like.models.moe",
    "torch._inductor.compile_fx",
)
"""What the ranks of most launches import (the rest is imported by the ranks that use it)."""

GRACE_S = 5.0
"""How long the ranks still running after a failure get to end on SIGTERM before SIGKILL."""

_PATH = list(sys.path)
"""The interpreter's module path; a rank's first entry is its script's folder (or its working
directory for ``-m``), as under torchrun."""


def main() -> None:
    _die_with_parent()
    for module in PRELOAD:
        __import__(module)
    for line in sys.stdin:
        request = json.loads(line)
        _check_forkable()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_supervise(request))
        _reply({"pid": pid})
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, its pid not yet free
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # what the ranks left behind (a writer, a worker)
        _, status = os.waitpid(pid, 0)
        _reply({"returncode": os.waitstatus_to_exitcode(status)})


def _die_with_parent() -> None:
    """SIGKILL this process when its parent ends (Linux ``prctl(PR_SET_PDEATHSIG)``)."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the call
        os._exit(1)


def _check_forkable() -> None:
    """A fork copies the lock of every other thread in whatever state it is in, and the
    process group would be the parent's: both must not exist."""
    import torch.distributed as dist

    if len(os.listdir("/proc/self/task")) != 1 or dist.is_initialized():
        sys.exit(f"rank server: a thread ({threading.enumerate()}) or a process group exists "
                 "before a fork; refusing to fork ranks from it")


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _supervise(request: dict) -> int:
    """One launch: its own process group, the caller's output files, environment and working
    directory; ``nproc`` ranks forked, then the store they meet in; torchrun's exit code."""
    try:
        _die_with_parent()
        os.setpgid(0, 0)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        nproc, ranks, writers = request["nproc"], {}, []
        for rank in range(nproc):
            reader, writer = os.pipe()
            pid = os.fork()
            if pid == 0:
                for fd in (*writers, writer):
                    os.close(fd)
                _die_with_parent()
                _exit(_rank(rank, nproc, reader, request["argv"]))
            os.close(reader)
            ranks[pid], writers = rank, [*writers, writer]
        store = _store(nproc)  # alive until the ranks are done
        for writer in writers:
            os.write(writer, f"{0 if store is None else store.port}\n".encode())
            os.close(writer)
        return _wait(ranks)
    except BaseException:
        traceback.print_exc()
        return 1


def _store(nproc: int):
    """The rendezvous store the ranks meet in, bound on a free port as torchrun's agent binds
    its own before the workers start (no port picked free and bound later by someone else);
    None for a world of one, which meets in memory (distributed/utils._store)."""
    if nproc == 1:
        return None
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False)


def _wait(ranks: dict[int, int]) -> int:
    """Wait for every rank; at the first failure report it and stop the others (a peer waiting
    in a collective would wait for its timeout). 0, or 1 after a failure (torchrun's codes)."""
    failure = None
    while ranks:
        pid, status = os.wait()
        rank, code = ranks.pop(pid), os.waitstatus_to_exitcode(status)
        if code != 0 and failure is None:
            failure = code
            _report(rank, pid, code)
            _stop(list(ranks))
    return 0 if failure is None else 1


def _report(rank: int, pid: int, code: int) -> None:
    """The root-cause lines torchrun prints for its first failed worker."""
    cause = (f"Signal {-code} ({signal.Signals(-code).name}) received by PID {pid}"
             if code < 0 else "To enable traceback see: "
             "https://pytorch.org/docs/stable/elastic/errors.html")
    print(f"Root Cause (first observed failure):\n[0]:\n  rank      : {rank} (local_rank: "
          f"{rank})\n  exitcode  : {code} (pid: {pid})\n  traceback : {cause}",
          file=sys.stderr, flush=True)


def _stop(pids: list[int]) -> None:
    """SIGTERM, then SIGKILL for the ranks still running after ``GRACE_S`` (torchrun's order;
    their exit is collected by ``_wait``)."""
    for sig, grace in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_running(pid) for pid in pids):
            time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether ``pid`` has not exited yet (a zombie has: waitid leaves it to be collected)."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is None


def _rank(rank: int, nproc: int, reader: int, argv: list[str]) -> int:
    """Run the worker as torchrun's rank ``rank`` would: ``argv`` is a script and its
    arguments, or ``-m module ...``."""
    port = os.read(reader, 32).decode().strip()
    os.close(reader)
    if not port:  # the supervisor died before binding the store
        return 1
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank),
        WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), ROLE_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0",
        TORCHELASTIC_RUN_ID=f"rank-server-{os.getppid()}")
    _one_intra_op_pool()
    sys.stdout.reconfigure(line_buffering=True)
    try:
        if argv[0] == "-m":
            sys.argv, sys.path[:] = argv[1:], [os.getcwd(), *_PATH[1:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *_PATH[1:]]
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as stop:
        if isinstance(stop.code, int) or stop.code is None:
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def _one_intra_op_pool() -> None:
    """The rank's intra-op thread count from its own ``OMP_NUM_THREADS``, as a process started
    with it has (the OpenMP runtime read the server's at import; no pool exists yet)."""
    import torch

    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _exit(code: int) -> None:
    """End a rank as an interpreter ends: wait for its non-daemon threads, run its exit
    handlers (multiprocessing's, which end its child processes; logging's), flush, exit."""
    with contextlib.suppress(BaseException):
        threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
