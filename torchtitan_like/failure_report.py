"""How a job that stops says why: one line ``<prefix>: <message>`` and the exit code of its
kind (exit_codes.py) for the failures it understands, the traceback for the others; the line is
also left for the launcher (distributed/lifecycle.record_failure). Used by the trainer's ``run``
and by preflight, which must end the same way.

Ctrl-C is not a failure: a KeyboardInterrupt, wherever it lands (a checkpoint save wraps it in
its own errors), ends the process with exit code 130 and one line, which the launcher prints
when it was the one interrupted (it stops its workers with the same SIGINT), so a worker under
it says nothing; nor does one that fails while its launcher stops the job (a peer interrupted
first: a lost connection; distributed/lifecycle.job_stopping).

A full disk (or quota) is understood wherever it strikes, also in a write that no
``storage.writing`` frames (components/storage.py)."""

from __future__ import annotations

import os

from torchtitan_like.components.checkpoint import CheckpointError
from torchtitan_like.components.data.sources import DataError
from torchtitan_like.components.run_folder import DumpFolderInUse
from torchtitan_like.components.spikes import TrainingDiverged
from torchtitan_like.components.storage import StorageError, full_storage
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed import lifecycle
from torchtitan_like.exit_codes import INTERRUPTED_LINE, ExitCode
from torchtitan_like.logging import logger

EXPECTED_FAILURES: tuple[tuple[type[BaseException], str, ExitCode], ...] = (
    (ConfigError, "config error", ExitCode.CONFIG),  # incl. what only the built model shows
    (TrainingDiverged, "training diverged", ExitCode.DIVERGED),
    (CheckpointError, "checkpoint error", ExitCode.CHECKPOINT),
    (StorageError, "storage error", ExitCode.CHECKPOINT),  # a full disk, wherever it strikes
    (DataError, "data error", ExitCode.DATA),
    (DumpFolderInUse, "dump folder in use", ExitCode.FOLDER_IN_USE),
)
"""Failures the job understands: one line ``<prefix>: <message>`` and their own exit code."""


def understood(error: BaseException) -> list[tuple[str, ExitCode]]:
    """The prefix and exit code of a failure the job understands (empty: an unexpected one)."""
    return [(prefix, code) for kind, prefix, code in EXPECTED_FAILURES if isinstance(error, kind)]


def ended_cleanly(error: BaseException) -> bool:
    """A job that stops with ``error`` ends on its own terms: a failure it understands (also a
    full disk anywhere), or the user's interrupt (components/run_folder.py: its lock record is
    emptied; after anything else the next job says it took the folder over)."""
    return (isinstance(error, SystemExit) or interrupted(error) or bool(understood(error))
            or full_storage(error) is not None)


def report_failure(error: BaseException) -> int:
    """Say why the job failed (one line, or the traceback of an unexpected error), leave the
    line for the launcher (distributed/lifecycle.py), and return the exit code."""
    if isinstance(error, SystemExit):  # --help, --print_config, a module that exits
        return 0 if error.code is None else error.code if isinstance(error.code, int) else 1
    if interrupted(error) or lifecycle.job_stopping():
        if not os.environ.get(lifecycle.AGENT_PID_ENV):  # else the launcher says it
            logger.error(INTERRUPTED_LINE)
        lifecycle.record_failure(ExitCode.INTERRUPTED, INTERRUPTED_LINE)
        return ExitCode.INTERRUPTED
    known = understood(error)
    full = None if known else full_storage(error)
    if full is not None:  # a full disk in a write that no storage.writing frames
        error, known = full, understood(full)
    if known:
        prefix, code = known[0]
        line = f"{prefix}: {error}"
        logger.error(line)
    else:
        logger.error("the job failed:", exc_info=error)
        line = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
        code = ExitCode.FAILED
    lifecycle.record_failure(code, line)
    return code


def interrupted(error: BaseException) -> bool:
    """Whether a KeyboardInterrupt is ``error`` or caused it: along ``__cause__`` and
    ``__context__``, and into the per-rank exceptions DCP's CheckpointException collects."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()
                     if isinstance(f, BaseException | tuple)]
    return False
