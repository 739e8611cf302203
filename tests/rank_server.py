"""A process that imports torch and the trainer once, then forks the ranks of every launch.

A torchrun launch pays, before its first step, for its agent importing torch (~2.5 s on a
2-core Xeon) and for every rank importing torch and the trainer (~3.6 s each, all ranks sharing
the 2 cores: ~7 s for 4 ranks, ~15 s for 8), and ~1.7 s after its last; the suite launches
about 45 times. This server (started once per pytest session by ``tests/harness.py``) pays
the imports once: for each launch it forks a supervisor, which forks ``nproc`` ranks from the
already imported interpreter and runs the worker in each as torchrun would (``__main__``,
``sys.argv``, the rank's environment, the rendezvous store bound by the supervisor before
the ranks look for it), then waits for them. What the ranks run is unchanged: the same
worker, the same trainer, the same process group; only their start is cheaper. Launches
that restart failed workers (``max_restarts``) and the tests of the launcher itself still go
through torchrun.

Forking is safe here because nothing before the fork starts a thread: imports only (the
server checks this and refuses to serve otherwise), one OpenMP thread (``OMP_NUM_THREADS=1``
from ``harness.env``, so no OpenMP pool exists), no process group, no CUDA.

Protocol: one JSON request per line on stdin ({"nproc", "argv", "env", "cwd", "stdout",
"stderr"}), answered by {"pid": the supervisor's} at once and {"returncode": ...} when the
launch ends (the first failing rank's exit code; the other ranks are then killed). The
supervisor leads its own process group, so a caller that times out kills the launch with
``os.killpg``. EOF on stdin ends the server.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
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


def main() -> None:
    for module in PRELOAD:
        __import__(module)
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        sys.exit(f"rank server: a thread runs after the imports ({threading.enumerate()}); "
                 "forking would copy its locks")
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_supervise(request))
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"returncode": os.waitstatus_to_exitcode(status)})


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _supervise(request: dict) -> int:
    """One launch: its own process group, the caller's output files, environment and working
    directory; ``nproc`` ranks forked, then the store they meet in; the first failure."""
    try:
        os.setpgid(0, 0)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
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
                os._exit(_rank(rank, nproc, reader, request["argv"]))
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
    """Wait for every rank; at the first failure kill the others (a peer waiting in a
    collective would wait for its timeout) and return that rank's code."""
    failure = 0
    while ranks:
        pid, status = os.wait()
        rank, code = ranks.pop(pid), os.waitstatus_to_exitcode(status)
        if code != 0 and failure == 0:
            failure = code if code > 0 else 128 - code
            print(f"rank server: rank {rank} exited with {code}", file=sys.stderr, flush=True)
            for other in ranks:
                os.kill(other, signal.SIGKILL)
    return failure


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
    sys.stdout.reconfigure(line_buffering=True)
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    main()
