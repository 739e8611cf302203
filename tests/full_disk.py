"""A full disk under chosen files, as the job's writes meet it (tests of components/storage.py).

``install("metrics.jsonl", after=3)`` makes every write to a file whose path contains
``metrics.jsonl`` fail with ``OSError(ENOSPC)`` from its fourth write on, the way a file system
that filled up answers: the file opens (creating it needs no data block), its writes fail.
Patched where Python writes reach the OS: ``open`` (``io.open``, which ``pathlib``, DCP and
TensorBoard use), ``os.write`` / ``os.pwrite`` on a descriptor of such a file (the lock record),
and safetensors' Rust writer (its error names the OS error in words only, as the real one does:
``... (os error 28)``). Unit tests pass ``monkeypatch.setattr`` as ``patch``.

As a ``[job] custom_import`` (this file's path), it installs itself in a job's workers from the
environment: ``TTL_FULL_DISK=pattern[:after]``, on rank ``TTL_FULL_DISK_RANK`` only if set.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
from typing import Any


class _FullFile:
    """A file on a full disk: writes fail once ``budget`` writes have gone through."""

    def __init__(self, file: Any, path: str, budget: list[int]):
        self._file, self._path, self._budget = file, path, budget

    def write(self, data: Any) -> int:
        if self._budget[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)
        self._budget[0] -= 1
        return self._file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _FullFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._file.close()

    def __iter__(self) -> Any:
        return iter(self._file)


def install(pattern: str, after: int = 0, patch: Any = setattr) -> None:
    """Fill the disk under files whose path contains ``pattern``, after ``after`` writes to
    them (all such files together)."""
    budget = [after]
    real_open, real_write, real_pwrite = io.open, os.write, os.pwrite

    def matches(path: Any) -> bool:  # TensorBoard names its files in bytes
        return isinstance(path, str | bytes | os.PathLike) and pattern in os.fsdecode(path)

    def full_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened = real_open(file, mode, *args, **kwargs)
        writing = any(m in mode for m in "wax+")
        return _FullFile(opened, os.fsdecode(file), budget) if writing and matches(file) \
            else opened

    def fd_full(fd: int) -> bool:
        try:
            return matches(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return False

    def full_write(fd: int, data: Any, *args: Any) -> int:
        if fd_full(fd):
            if budget[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            budget[0] -= 1
        return (real_pwrite if args else real_write)(fd, data, *args)

    patch(io, "open", full_open)
    patch(builtins, "open", full_open)
    patch(os, "write", lambda fd, data: full_write(fd, data))
    patch(os, "pwrite", lambda fd, data, offset: full_write(fd, data, offset))
    _fill_safetensors(matches, patch)


def _fill_safetensors(matches: Any, patch: Any) -> None:
    import safetensors.torch
    from safetensors import SafetensorError

    from torchtitan_like.components import hf_checkpoint

    real = safetensors.torch.save_file

    def save_file(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> None:
        if matches(filename):
            raise SafetensorError("Error while serializing: I/O error: No space left on device "
                                  "(os error 28)")
        real(tensors, filename, *args, **kwargs)

    patch(safetensors.torch, "save_file", save_file)
    patch(hf_checkpoint, "save_file", save_file)


if os.environ.get("TTL_FULL_DISK") and os.environ.get("TTL_FULL_DISK_RANK", "") in (
        "", os.environ.get("RANK", "0")):
    _pattern, _, _after = os.environ["TTL_FULL_DISK"].partition(":")
    install(_pattern, int(_after or 0))
