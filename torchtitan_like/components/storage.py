"""A write of the job that fails for a reason a restart would meet again: one line, exit 4.

Every file a job writes (metrics.jsonl, TensorBoard events, the trackers' stores, the dump
folder's lock record, the config copy, checkpoints, HuggingFace exports) is written inside
``writing(what, path)``: an error whose cause is a full disk, an exceeded quota, a read-only
file system or a permission refused becomes ``StorageError`` naming the file and the cause
(``storage error: writing metrics.jsonl (outputs/x/metrics.jsonl) failed: no space left on
the device (the disk is full)``), which the job reports in one line with exit code 4 and the
launcher does not restart (exit_codes.FINAL): the next attempt would find the same disk. Other
errors pass through unchanged (a restart may cure them). The cause is looked for through the
``raise ... from`` chain, and in the text of errors raised by Rust-backed libraries
(safetensors, tokenizers), which carry the OS error number in words only.

A full disk is final wherever it strikes, even in a write no ``writing`` frames (a profiler
trace, a compiled kernel's cache): failure_report.py says it in the same words
(``full_storage``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

REASONS = {
    errno.ENOSPC: "no space left on the device (the disk is full)",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a path component is a file, not a folder",
    errno.ENOENT: "no such file or folder",
    errno.EIO: "an I/O error of the device",
}
"""The words for the OS errors a checkpoint or output write meets."""

FINAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
"""Causes of a failed write that a restart meets again."""

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""A storage that is full: final whatever the operation that found it."""

_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")


class StorageError(RuntimeError):
    """A write failed for a reason a restart would meet again; the message names the file."""


def os_errno(error: BaseException) -> int | None:
    """The OS error number behind ``error``: an OSError's, or one a Rust-backed library
    (safetensors, tokenizers) wrote into its message; None when there is none."""
    if isinstance(error, OSError):
        return error.errno
    match = _RUST_OS_ERROR.search(str(error))
    return int(next(g for g in match.groups() if g)) if match else None


def os_cause(error: BaseException) -> tuple[BaseException, int] | None:
    """The first error of the ``raise ... from`` chain that carries an OS error number, with
    it; None when none does."""
    cause: BaseException | None = error
    seen = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        number = os_errno(cause)
        if number is not None:
            return cause, number
        cause = cause.__cause__ or cause.__context__
    return None


def describe(number: int, filename: str | None = None) -> str:
    """An OS error in words, with the file it concerns."""
    reason = REASONS.get(number, os.strerror(number))
    return reason + (f" ({filename})" if filename else "")


def storage_failure(error: BaseException, what: str,
                    path: Path | str | None = None) -> StorageError | None:
    """``StorageError`` for a failed write of ``what`` (to ``path``) whose cause a restart
    meets again (a full disk, a quota, a read-only file system, a refused permission); None
    otherwise."""
    found = os_cause(error)
    if found is None or found[1] not in FINAL_ERRNOS:
        return None
    cause, number = found
    filename = getattr(cause, "filename", None)
    where = f" ({path})" if path is not None else ""
    same = filename is not None and path is not None and str(filename) == str(path)
    return StorageError(f"writing {what}{where} failed: "
                        f"{describe(number, None if same else filename)}")


def full_storage(error: BaseException) -> StorageError | None:
    """``StorageError`` for any error caused by a full disk or an exceeded quota, wherever it
    struck; None otherwise (failure_report.py, for writes that no ``writing`` frames)."""
    found = os_cause(error)
    if found is None or found[1] not in FULL_ERRNOS:
        return None
    cause, number = found
    filename = getattr(cause, "filename", None)
    return StorageError(f"a write failed: {describe(number, filename)}")


@contextlib.contextmanager
def writing(what: str, path: Path | str | None = None) -> Iterator[None]:
    """Frame a write of ``what`` (to ``path``): a final cause becomes ``StorageError``."""
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        failure = storage_failure(e, what, path)
        if failure is None:
            raise
        raise failure from e
