"""A reader of W&B's offline run files (``offline-run-*/run-<id>.wandb``), for the tests.

wandb 0.31 writes them and ships no reader. The format (wandb-core's ``store`` package) is
LevelDB's log format behind a 7-byte header (``:W&B``, magic 0xBEE1 little-endian, version 0):
32 KiB blocks of chunks, each ``crc32c (4) | length (2, LE) | type (1)`` then the bytes; type 1
is a whole record, 2/3/4 the first, middle and last piece of one that spans blocks; a block
tail under 7 bytes is padding. Each record is a ``wandb.proto.wandb_internal_pb2.Record``
(wandb's own protobuf definitions), e.g. ``run`` (its config) or ``history`` (one row per
step, values as JSON). The CRCs are not checked: the tests compare every value anyway.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = b":W&B\xe1\xbe\x00"
CHUNK = struct.Struct("<IHB")
WHOLE, LAST = 1, 4


def read_records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data.startswith(HEADER), data[:7]
    pos, pieces = len(HEADER), []
    while pos + CHUNK.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK.size:
            pos += left  # padding at the end of a block
            continue
        _crc, length, kind = CHUNK.unpack_from(data, pos)
        pieces.append(data[pos + CHUNK.size: pos + CHUNK.size + length])
        pos += CHUNK.size + length
        if kind in (WHOLE, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(pieces))
            pieces = []
            yield record


def _key(item: Any) -> str:
    """An item names its key in ``key`` or, as wandb-core writes it, in ``nested_key``."""
    return item.key or ".".join(item.nested_key)


def read_run(path: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(the run's config, {step: that step's history row}) of one offline run file; wandb's
    own columns (``_step``, ``_runtime``, ``_timestamp``) are left out."""
    config: dict[str, Any] = {}
    rows: dict[int, dict[str, Any]] = {}
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config = {_key(item): json.loads(item.value_json) for item in record.run.config.update
                      if not _key(item).startswith("_")}
        elif kind == "history":
            row = rows.setdefault(record.history.step.num, {})
            row.update({_key(item): json.loads(item.value_json) for item in record.history.item
                        if not _key(item).startswith("_")})
    return config, rows
