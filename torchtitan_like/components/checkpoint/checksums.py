"""Checkpoints that prove their bytes: a CRC-32 of every stored item, written with the save and
verified by each rank on the bytes it reads.

DCP keeps no checksums, and torch's loader does not check the CRC-32s its zip format carries:
a flipped bit inside a tensor's data loads silently. Here DCP's own extension points carry
them, and the checkpoint stays a plain DCP checkpoint (any DCP reader loads it and ignores
``checksums.json``):

- **Save** (``ChecksumWriter``, a ``FileSystemWriter``): DCP writes through its writer's
  ``fs.create_stream``; the writer's file system hands out streams that run ``zlib.crc32`` over
  the bytes as they pass, in memory, so nothing is read back. DCP asks ``tell()`` at the start
  and the end of every item it stores, which splits a file into its items. Each rank returns
  its items' CRCs with its write results; the coordinator writes them to ``checksums.json``
  (``{file: [[offset, length, crc32, name], ...]}``) before DCP's ``.metadata``. An item whose
  bounds a future DCP marked otherwise is read back and summed, so a save never fails for it.
- **Load** (``ChecksumReader``, a ``FileSystemReader``): DCP reads every item it needs through
  the reader's ``_slice_file``, whole even when the rank keeps only a slice (resharding); the
  reader reads those bytes into memory, checks their CRC and hands DCP the same bytes. So each
  rank verifies exactly what it reads, under any layout, once. A mismatch raises
  ``ChecksumMismatch`` naming the file, the byte range and the state; the checkpoint manager
  says it as one ``checkpoint error:`` line (and may fall back to an earlier checkpoint,
  ``[checkpoint] fallback_on_damage``).

Cost: one CRC-32 pass over the bytes at save (in DCP's writer thread or process: async saves
keep it off the loop) and one at load, measured by ``scripts/bench_checksums.py``
(docs/measurements.md). A checkpoint written before checksums existed has no
``checksums.json``: it loads unverified, said in one log line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from torchtitan_like.logging import logger

CHECKSUM_FILE = "checksums.json"

Sums = dict[tuple[str, int, int], tuple[int, str]]
"""(file, offset, length) of a stored item -> (its CRC-32, the state it holds)."""


class ChecksumMismatch(RuntimeError):
    """Bytes of a checkpoint that are not the bytes its save wrote."""


class _SummingStream:
    """A file DCP writes: the CRC-32 of the bytes between each two ``tell()`` calls (DCP's
    item boundaries) goes into ``sums`` under (file, start, length)."""

    def __init__(self, stream: Any, name: str, sums: dict[tuple[str, int, int], int]):
        self._stream, self._name, self._sums = stream, name, sums
        self._start, self._crc = stream.tell(), 0

    def write(self, data: Any) -> int:
        written = self._stream.write(data)
        self._crc = zlib.crc32(data, self._crc)
        return written

    def tell(self) -> int:
        position = self._stream.tell()
        self._sums[(self._name, self._start, position - self._start)] = self._crc
        self._start, self._crc = position, 0
        return position

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self) -> None:
        self._stream.close()


class _SummingFileSystem(FileSystem):
    """DCP's file system, whose write streams sum what they write."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[tuple[str, int, int], int] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            yield _SummingStream(stream, Path(path).name, self.sums) if mode == "wb" else stream


@dataclasses.dataclass(frozen=True)
class _Summed:
    """A write result's storage info with the CRC-32 of the item (to the coordinator)."""

    info: Any
    crc: int


def _crc_of_file_range(path: Path, offset: int, length: int) -> int:
    with path.open("rb") as f:
        f.seek(offset)
        return zlib.crc32(f.read(length))


class ChecksumWriter(FileSystemWriter):
    """DCP's FileSystemWriter, plus ``checksums.json`` (module docstring)."""

    def __init__(self, path: str | os.PathLike, **kwargs: Any):
        super().__init__(path, **kwargs)
        self.fs = _SummingFileSystem()

    def write_data(self, plan: Any, planner: Any) -> Future[list[WriteResult]]:
        self.fs.sums.clear()
        written = super().write_data(plan, planner)
        results = [dataclasses.replace(r, storage_data=_Summed(r.storage_data, self._crc(r)))
                   for r in written.wait()]
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _crc(self, result: WriteResult) -> int:
        info = result.storage_data
        key = (info.relative_path, info.offset, info.length)
        if key in self.fs.sums:
            return self.fs.sums[key]
        return _crc_of_file_range(Path(self.path) / info.relative_path, info.offset, info.length)

    def finish(self, metadata: Any, results: list[list[WriteResult]]) -> None:
        table: dict[str, list[list[Any]]] = {}
        plain = []
        for rank_results in results:
            plain.append([])
            for result in rank_results:
                summed = result.storage_data
                if isinstance(summed, _Summed):
                    info = summed.info
                    table.setdefault(info.relative_path, []).append(
                        [info.offset, info.length, summed.crc, result.index.fqn])
                    result = dataclasses.replace(result, storage_data=info)
                plain[-1].append(result)
        with (Path(self.path) / CHECKSUM_FILE).open("w") as f:
            json.dump({"algorithm": "crc32", "items": table}, f)
            f.flush()
            os.fsync(f.fileno())
        super().finish(metadata, plain)


def read_checksums(path: Path) -> Sums | None:
    """A checkpoint's checksums, or None when it has none (saved before they existed);
    ChecksumMismatch when the file is unreadable."""
    file = path / CHECKSUM_FILE
    if not file.exists():
        return None
    try:
        data = json.loads(file.read_text())
        return {(name, int(offset), int(length)): (int(crc), str(state))
                for name, rows in data["items"].items() for offset, length, crc, state in rows}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ChecksumMismatch(f"{CHECKSUM_FILE} is unreadable ({e})") from e


def note_unverified(path: Path) -> None:
    """The one log line of a checkpoint saved without checksums."""
    logger.info(f"checkpoint: {path} was saved without checksums (by a version before them): "
                "its bytes load unverified")


def checksums_of(path: Path) -> Sums | None:
    """``read_checksums``, saying in one log line that a checkpoint without them loads
    unverified."""
    sums = read_checksums(path)
    if sums is None:
        note_unverified(path)
    return sums


def uncovered(metadata: Any, sums: Sums) -> list[str]:
    """The stored items of ``metadata`` that ``sums`` has no checksum for."""
    return [f"{info.relative_path} bytes {info.offset}-{info.offset + info.length}"
            for info in metadata.storage_data.values()
            if (info.relative_path, info.offset, info.length) not in sums]


class ChecksumReader(FileSystemReader):
    """DCP's FileSystemReader that checks every item it reads against ``sums`` (None: an old
    checkpoint without checksums, read as is)."""

    def __init__(self, path: str | os.PathLike, sums: Sums | None):
        super().__init__(path)
        self.sums = sums

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        view = super()._slice_file(file, sinfo)
        if self.sums is None:
            return view
        data = view.read()
        key = (sinfo.relative_path, sinfo.offset, sinfo.length)
        crc, state = self.sums.get(key, (None, "?"))
        if len(data) != sinfo.length or zlib.crc32(data) != crc:
            raise ChecksumMismatch(
                f"{sinfo.relative_path} bytes {sinfo.offset}-{sinfo.offset + sinfo.length} "
                f"({state}) are not the bytes saved: their CRC-32 differs")
        return io.BytesIO(data)
