"""What a failed checkpoint save or load tells the user: one line naming the cause.

DCP gathers every rank's exception of a failed save or load into a ``CheckpointException`` (a
``BaseException``: ``except Exception`` misses it) whose text is every rank's traceback. Here
the first failing rank's original exception is found and said in words: an OS error names its
reason and file (a full disk, a missing or read-only folder), bytes that do not read back name
the damage. torch's own zip writer reports a full disk without an errno ("unexpected pos 704 vs
598"), so when a save fails on a file system with less space free than the newest checkpoint
takes (or 16 MiB), the full disk is named, in those words only (the zip writer's text says
nothing to a user). Such failures repeat on a restart: they become CheckpointError (exit 4, not
restarted). A save that fails otherwise (a peer that stopped answering DCP's collectives) stays
a plain error, which a restart may cure.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException

from torchtitan_like.components import storage
from torchtitan_like.components.checkpoint.checksums import ChecksumMismatch
from torchtitan_like.components.checkpoint.validate import CheckpointDamaged, CheckpointError

_MIN_FREE_BYTES = 16 * 2**20


def root_cause(exc: BaseException) -> tuple[BaseException, int | None]:
    """The original exception of the first failing rank (and that rank), through DCP's
    CheckpointException and the ``raise ... from`` chain, preferring an OSError."""
    rank = None
    if isinstance(exc, CheckpointException) and exc.failures:
        rank = min(exc.failures)
        exc = exc.failures[rank][0]
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    return cause or exc, rank


def one_line(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def describe_os_error(error: OSError) -> str:
    if error.errno is None:
        return one_line(error)
    return storage.describe(error.errno, error.filename)


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def full_disk(folder: Path, newest: Path | None) -> str | None:
    """Words for a file system too full for another checkpoint, else None."""
    existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
    if existing is None:
        return None
    free = shutil.disk_usage(existing).free
    size = _folder_size(newest) if newest is not None else 0
    if free >= max(size, _MIN_FREE_BYTES):
        return None
    than = (f"the newest checkpoint takes {size / 2**20:.1f} MiB" if newest is not None
            else f"below {_MIN_FREE_BYTES // 2**20} MiB")
    return (f"only {free / 2**20:.1f} MiB free on the file system of {folder} ({than}): the "
            "disk is full")


def save_failure(exc: BaseException, step: int, folder: Path,
                 newest: Path | None) -> BaseException:
    """What a failed save of ``step`` raises (module docstring); ``newest`` is the last
    complete checkpoint, which the failure leaves in place."""
    cause, rank = root_cause(exc)
    where = "" if rank is None else f" on rank {rank}"
    kept = (f"the last complete checkpoint {newest.name} is kept" if newest is not None
            else "no complete checkpoint exists yet")
    if isinstance(cause, OSError):
        return CheckpointError(f"step {step}: the save failed{where}: "
                               f"{describe_os_error(cause)}; {kept}")
    disk = full_disk(folder, newest)
    if disk is not None:
        return CheckpointError(f"step {step}: the save failed{where}: {disk}; {kept}")
    return RuntimeError(f"checkpoint step {step}: the save failed{where}: {one_line(cause)}")


def load_failure(exc: BaseException, where: str, path: Path | None = None) -> CheckpointError:
    """What a failed load of ``where`` (the checkpoint ``path``) raises: the cause in words,
    and what to do; bytes that fail their checksum are damage (CheckpointDamaged)."""
    cause, rank = root_cause(exc)
    on = "" if rank is None else f" on rank {rank}"
    if isinstance(cause, ChecksumMismatch):
        return CheckpointDamaged(f"{where} is damaged: {cause} (found by rank "
                                 f"{0 if rank is None else rank})", path)
    if isinstance(cause, OSError):
        return CheckpointError(f"loading {where} failed{on}: {describe_os_error(cause)}")
    return CheckpointError(
        f"loading {where} failed{on}: {one_line(cause, 100)}; its files are damaged or do not "
        "fit this model: move it away to resume from an earlier checkpoint, or choose one with "
        "--checkpoint.load_step")
