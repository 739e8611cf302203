"""Every exit code a job ends with, in one place (docs/operating-a-run.md lists them).

A job that fails for a reason it understands prints one line (``config error: ...``) and ends
with that reason's code; ``python -m torchtitan_like.launch`` (what run_train.sh runs) passes
the first failing rank's code to the shell and does not restart a job whose failure would
only repeat (``FINAL``). Imports nothing: every layer, the launcher and the tools may use it.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    """The job did all its work."""
    FAILED = 1
    """Anything unexpected (the rank prints its traceback); restarted under MAX_RESTARTS."""
    CONFIG = 2
    """``config error:`` a config, a plan or a dump folder that cannot run as asked."""
    DIVERGED = 3
    """``training diverged:`` the loss or gradient norm stopped being finite."""
    CHECKPOINT = 4
    """``checkpoint error:`` a checkpoint that cannot be loaded or saved (corrupt, disk full);
    ``storage error:`` any other write of the job on a full disk (components/storage.py)."""
    DATA = 5
    """``data error:`` a dataset record that cannot be read (file and line named)."""
    FOLDER_IN_USE = 6
    """``dump folder in use:`` another running job holds the dump folder's lock."""
    INTERRUPTED = 130
    """Ctrl-C (SIGINT, 128 + 2, the shell's convention): stopped; the same command resumes."""


FINAL = frozenset({ExitCode.CONFIG, ExitCode.DIVERGED, ExitCode.CHECKPOINT, ExitCode.DATA,
                   ExitCode.FOLDER_IN_USE})
"""Failures that a restart would meet again (the same config, data or checkpoint): never
restarted. Unexpected failures, signals and timeouts (a lost peer) are."""

INTERRUPTED_LINE = ("stopped by SIGINT (Ctrl-C); the same command resumes from the latest "
                    "complete checkpoint ([checkpoint] enable)")
"""What a job stopped by Ctrl-C says: the launcher's line, or the trainer's without one."""
