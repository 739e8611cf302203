"""Start-up checks of a prepared (tokenized) folder against its manifest (format: prepared.py).

Training reads a prepared split by offset, so a file that does not match its manifest fails
late and far away: a truncated ``train.bin`` as a shape error at the step that reads past its
end, an id beyond the vocabulary as an IndexError (a device-side assert on CUDA), an empty
held-out split at the first validation. Here each is one ConfigError before anything starts:

- every split's ``.bin`` holds exactly ``tokens`` ids of the manifest's dtype (size on disk);
- its document index is int64, ``documents + 1`` long, starts at 0, never decreases and ends
  at ``tokens``;
- every id is below the vocabulary: the maximum ``prepare_data.py`` recorded (``max_id``) when
  the manifest has it, and in any case a bounded scan of the file (all of it up to
  ``SCAN_TOKENS``, else ``SCAN_CHUNKS`` evenly spaced windows of that total, the ends included);
- the train split is not empty, nor the validation split when validation is on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from torchtitan_like.components.data.prepared import SPLITS, read_manifest, split_files
from torchtitan_like.config.errors import ConfigError

SCAN_TOKENS = 1 << 22
"""Ids read per split by the start-up scan (4 Mi ids: 8 MiB of uint16, a few ms)."""

SCAN_CHUNKS = 64
"""Windows the scan is spread over when a split holds more than SCAN_TOKENS ids."""


def _again(folder: Path) -> str:
    return f"run scripts/prepare_data.py INPUT... --out {folder} again"


def _scan_max(path: Path, dtype: np.dtype, tokens: int) -> tuple[int, int]:
    """(largest id, its offset) over the scanned part of a split's stream."""
    ids = np.memmap(path, dtype=dtype, mode="r", shape=(tokens,))
    if tokens <= SCAN_TOKENS:
        windows = [(0, tokens)]
    else:
        width = SCAN_TOKENS // SCAN_CHUNKS
        starts = np.linspace(0, tokens - width, SCAN_CHUNKS).astype(np.int64)
        windows = [(int(start), width) for start in starts]
    best = (-1, 0)
    for start, width in windows:
        window = ids[start : start + width]
        at = int(window.argmax())
        best = max(best, (int(window[at]), start + at))
    return best


def _check_index(folder: Path, split: str, counts: dict[str, int]) -> None:
    path = split_files(folder, split)[1]
    try:
        index = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ConfigError(f"{path}: not a readable document index ({e}); {_again(folder)}"
                          ) from None
    problem = None
    if index.dtype != np.int64 or index.shape != (counts["documents"] + 1,):
        problem = (f"{index.dtype} of shape {index.shape}, not int64 of shape "
                   f"({counts['documents'] + 1},)")
    elif index[0] != 0 or index[-1] != counts["tokens"]:
        problem = f"runs from {index[0]} to {index[-1]}, not from 0 to {counts['tokens']}"
    elif index.size > 1 and bool((np.diff(index) < 0).any()):
        problem = "decreases somewhere (its offsets must never decrease)"
    if problem:
        raise ConfigError(f"{path}: the document index {problem}; {_again(folder)}")


def _check_stream(folder: Path, split: str, counts: dict[str, Any], dtype: np.dtype,
                  vocab_size: int) -> None:
    path = split_files(folder, split)[0]
    expected = counts["tokens"] * dtype.itemsize
    size = path.stat().st_size if path.is_file() else None
    if size != expected:
        found = "missing" if size is None else f"{size:,} bytes"
        raise ConfigError(f"{path} is {found}, but the manifest says {counts['tokens']:,} ids "
                          f"of {dtype.name} ({expected:,} bytes): the folder is incomplete or "
                          f"was changed since; {_again(folder)}")
    recorded = counts.get("max_id")
    if isinstance(recorded, int) and recorded >= vocab_size:
        raise ConfigError(f"{path}: its manifest records ids up to {recorded}, beyond the "
                          f"vocabulary of {vocab_size} tokens; prepare it with this tokenizer")
    if counts["tokens"]:
        largest, offset = _scan_max(path, dtype, counts["tokens"])
        if largest >= vocab_size:
            raise ConfigError(f"{path}: id {largest} at offset {offset:,} is beyond the "
                              f"vocabulary of {vocab_size} tokens (the file is corrupt); "
                              f"{_again(folder)}")


def check_prepared_folder(folder: Path, vocab_size: int, validation: bool) -> None:
    """ConfigError unless ``folder``'s files match its manifest (module docstring), its ids are
    below ``vocab_size`` and the splits the job reads are not empty."""
    manifest = read_manifest(folder)
    try:
        dtype = np.dtype(manifest["dtype"])
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind != "u" or dtype.itemsize not in (1, 2, 4):
        raise ConfigError(f"{folder}: its manifest's dtype {manifest['dtype']!r} is not "
                          f"uint8, uint16 or uint32; {_again(folder)}")
    for split in SPLITS:
        counts = manifest["splits"][split]
        if counts["tokens"] == 0 and split == "train":
            raise ConfigError(f"{folder} holds no training documents; {_again(folder)}")
        if counts["tokens"] == 0 and validation:
            raise ConfigError(f"[validation] enable: the held-out split of {folder} is empty; "
                              "prepare it from more documents or with a lower --holdout-every, "
                              "or set [validation] enable = false")
        _check_stream(folder, split, counts, dtype, vocab_size)
        _check_index(folder, split, counts)
