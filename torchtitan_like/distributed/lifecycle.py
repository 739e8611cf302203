"""How a process of a distributed job lives and ends: with its torchrun agent, and without
racing gloo's threads; and how a failing rank tells the launcher why it failed.

**Dying with the agent.** torch 2.13's torchrun starts every worker in a session of its own
(``start_new_session``), so SIGKILL of the agent (or of its node's launcher) reaches no worker,
and nothing tells them: orphans keep training, writing into the dump folder and holding their
GPUs. ``die_with_agent`` starts a watchdog thread that polls the parent's pid (as torch's own
DataLoader workers do) and SIGKILLs the worker's process group (the worker, DCP's checkpoint
writer process, data-loading workers) once the agent is gone. A watchdog rather than a
parent-death signal (``PR_SET_PDEATHSIG``): that signal fires when the *thread* that forked the
child ends, which a launcher starting workers from a helper thread would turn into killed
healthy workers, and it exists on Linux only.

**Ending without the exit race.** After a gloo collective, the backend's worker thread may
hold the last reference to the collective's tensors for a moment after the main thread moved on.
If Python is finalising by then, that thread's request for the GIL ends it with
``pthread_exit`` inside a C++ ``noexcept`` destructor: "terminate called without an active
exception", SIGABRT, after the job printed "done" (3 in ~150 loaded runs of the trainer, 1 in 15
of the test workers). ``exit_process`` destroys the process groups, ends the process's
multiprocessing children, flushes, and leaves with ``os._exit``, skipping finalisation and the
race with it. Every torchrun entry point ends through it (the trainer, generation, the test
workers).

**Failure records.** A rank that fails writes one JSON record (its rank, exit code, one-line
error, time) into the folder the launcher names in ``TORCHTITAN_LIKE_FAILURES``, and into
torchrun's own error file (``TORCHELASTIC_ERROR_FILE``, read by torchrun's failure report);
``torchtitan_like.launch`` reads them to print the first failing rank's line whatever LOG_RANK
shows, and to decide whether a restart can help.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import torch.distributed as dist

AGENT_PID_ENV = "TORCHTITAN_LIKE_AGENT_PID"
"""The launcher's pid, set by torchtitan_like.launch for its workers: the watchdog then also
catches an agent that died before the worker started watching."""

FAILURES_ENV = "TORCHTITAN_LIKE_FAILURES"
"""The folder the launcher reads failure records from (one file per attempt and rank)."""


def die_with_agent(poll_s: float = 0.5) -> None:
    """Under torchrun: end this worker and its process group within ``poll_s`` of its agent's
    death (a no-op outside torchrun, where the process belongs to its shell)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    agent = int(os.environ.get(AGENT_PID_ENV) or os.getppid())
    threading.Thread(target=_watch_agent, args=(agent, poll_s), daemon=True,
                     name="agent-watchdog").start()


def _watch_agent(agent: int, poll_s: float) -> None:
    while os.getppid() == agent:
        time.sleep(poll_s)
    print(f"the torchrun agent (pid {agent}) is gone: ending worker {os.getpid()} and its "
          "process group", file=sys.stderr, flush=True)
    if os.getpgrp() == os.getpid():  # torchrun's workers lead their own process group
        os.killpg(os.getpid(), signal.SIGKILL)
    _end_children()
    os.kill(os.getpid(), signal.SIGKILL)


def _end_children(timeout_s: float = 5.0) -> None:
    """Terminate this process's multiprocessing children (DCP's checkpoint writer, data
    workers): ``os._exit`` skips the handler that would, and they must not outlive the job."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    deadline = time.monotonic() + timeout_s
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()


def exit_process(code: int) -> NoReturn:
    """End this process with ``code`` (see the module docstring: no exit race, no orphaned
    children). After a failure the process groups are not destroyed: a peer may be gone, and
    the exit closes every connection anyway."""
    if code == 0 and dist.is_initialized():
        dist.destroy_process_group()
    _end_children()
    for handler in logging.getLogger("torchtitan_like").handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclasses.dataclass(frozen=True)
class Failure:
    """One rank's failure, as the launcher reads it."""

    rank: int
    code: int
    line: str
    time: float


def record_failure(code: int, line: str) -> None:
    """Leave this rank's one-line error where the launcher (and torchrun's report) read it."""
    rank = int(os.environ.get("RANK", 0))
    failure = Failure(rank, int(code), line, time.time())
    folder = os.environ.get(FAILURES_ENV)
    if folder:
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        path = Path(folder) / f"attempt{attempt}-rank{rank}.json"
        path.write_text(json.dumps(dataclasses.asdict(failure)))
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # torchrun's format: a message and an integer timestamp
        Path(error_file).write_text(json.dumps({"message": line,
                                                "timestamp": int(failure.time)}))


STOPPING = "stopping"
"""The file the launcher writes into the failures folder before it stops its workers on a
signal (Ctrl-C): a rank failing from then on (a peer interrupted first, a lost connection) is
part of the stop, not a cause, and says nothing (failure_report.py)."""


def mark_stopping(folder: Path) -> None:
    (folder / STOPPING).touch()


def job_stopping() -> bool:
    """Whether this worker's launcher is stopping the job on a signal (``mark_stopping``)."""
    folder = os.environ.get(FAILURES_ENV)
    return bool(folder) and (Path(folder) / STOPPING).exists()


def read_failures(folder: Path, attempt: int) -> list[Failure]:
    """The failure records of one attempt (restart) of the job, earliest first."""
    failures = []
    for path in folder.glob(f"attempt{attempt}-rank*.json"):
        try:
            failures.append(Failure(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):  # a record cut short by a kill: not a cause
            continue
    return sorted(failures, key=lambda f: f.time)


def first_failure(failures: list[Failure]) -> Failure | None:
    """The cause among a failed attempt's failures (codes below 0 are deaths by a signal):
    the earliest that a rank understood (its own exit code); else the earliest death by a
    signal other than SIGTERM (a kill, the OOM killer, a crash: the other ranks then fail a
    moment later with a lost connection); else the earliest unexpected error; else the rest
    (SIGTERM is how the agent stops the ranks still running)."""
    def priority(failure: Failure) -> tuple[int, float]:
        if failure.code > 1:
            return 0, failure.time
        if failure.code < 0 and failure.code != -signal.SIGTERM:
            return 1, failure.time
        return (2 if failure.code == 1 else 3), failure.time

    return min(failures, key=priority, default=None)
