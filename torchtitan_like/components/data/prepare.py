"""Tokenize text/JSON-lines/Parquet documents once into a prepared folder (format: prepared.py).

Documents are read in the order the on-the-fly path reads them (sources.py), tokenized in
chunks by a pool of processes, and written in that same order, so the prepared stream equals the
one every rank would otherwise tokenize at start-up. Only a bounded window of chunks is in
flight, so memory stays flat however large the corpus. Re-running with the same inputs,
tokenizer and held-out rule finds the manifest up to date and does nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from torchtitan_like.components.data.prepared import (
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    split_files,
    token_dtype,
    tokenizer_identity,
)
from torchtitan_like.components.data.sources import (
    SUPPORTED_SUFFIXES,
    DataError,
    DecodeErrors,
    data_files,
    local_documents,
)
from torchtitan_like.components.data.tokenizer import Tokenizer, build_tokenizer

CHUNK_DOCUMENTS = 256
"""Documents per task sent to a tokenizing process: large enough to amortise the transfer."""


@dataclasses.dataclass
class PrepareResult:
    """What one call did: ``skipped`` when the folder was already up to date."""

    manifest: dict[str, Any]
    skipped: bool
    seconds: float
    input_bytes: int


def input_files(inputs: list[Path]) -> list[Path]:
    """The supported files of every input (a file, or a folder searched recursively)."""
    files = []
    for path in inputs:
        if not path.exists():
            raise DataError(f"{path} does not exist")
        found = data_files(path)
        if not found:
            raise DataError(f"{path}: no {'/'.join(SUPPORTED_SUFFIXES)} files")
        files += found
    return files


def content_hash(files: list[Path]) -> str:
    """SHA-256 over the files' names and bytes, in reading order."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(functools.partial(f.read, 1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


@functools.cache
def _tokenizer(tokenizer_path: str) -> Tokenizer:
    """One tokenizer per process, built on its first task."""
    return build_tokenizer(tokenizer_path)


def _encode_chunk(task: tuple[str, str, list[str]]) -> list[np.ndarray]:
    """``BOS doc EOS`` of each document of a chunk, in the prepared dtype."""
    tokenizer_path, dtype, documents = task
    tok = _tokenizer(tokenizer_path)
    return [np.array([tok.bos_id, *tok.encode(text), tok.eos_id], dtype=dtype)
            for text in documents]


class _Progress:
    """One self-overwriting stderr line, at most twice a second (no dependency needed)."""

    def __init__(self, total_bytes: int, stream: TextIO | None):
        self.total_bytes, self.stream = total_bytes, stream
        self.start = self.last = time.perf_counter()
        self.documents = self.tokens = 0

    def update(self, documents: int, tokens: int, final: bool = False) -> None:
        self.documents += documents
        self.tokens += tokens
        now = time.perf_counter()
        if self.stream is None or (now - self.last < 0.5 and not final):
            return
        self.last = now
        rate = self.tokens / max(now - self.start, 1e-9)
        self.stream.write(f"\rprepare: {self.documents:,} documents, {self.tokens:,} tokens "
                          f"({rate:,.0f} tokens/s) of {self.total_bytes / 2**20:,.1f} MiB input"
                          + ("\n" if final else ""))
        self.stream.flush()


def _tokenized_chunks(documents: Iterator[str], tokenizer_path: str, dtype: str,
                      workers: int) -> Iterator[list[np.ndarray]]:
    """Chunks of tokenized documents in document order, ``workers`` processes at a time."""
    chunks = iter(lambda: list(itertools.islice(documents, CHUNK_DOCUMENTS)), [])
    tasks = ((tokenizer_path, dtype, chunk) for chunk in chunks)
    if workers == 1:
        yield from map(_encode_chunk, tasks)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        while window := list(itertools.islice(tasks, 4 * workers)):  # bounded memory
            yield from pool.map(_encode_chunk, window)


def _write_splits(out: Path, chunks: Iterator[list[np.ndarray]], holdout_every: int,
                  progress: _Progress) -> dict[str, dict[str, int]]:
    """Append each document to its split's stream; write the document indexes. Per split:
    documents, tokens and the largest id (``max_id``, which start-up checks against the
    vocabulary)."""
    lengths: dict[str, list[int]] = {split: [] for split in SPLITS}
    max_id = dict.fromkeys(SPLITS, -1)
    streams = {split: split_files(out, split)[0].open("wb") for split in SPLITS}
    index = 0
    try:
        for chunk in chunks:
            for tokens in chunk:
                held_out = holdout_every > 0 and index % holdout_every == holdout_every - 1
                split = SPLITS[held_out]
                streams[split].write(tokens.tobytes())
                lengths[split].append(len(tokens))
                max_id[split] = max(max_id[split], int(tokens.max()))
                index += 1
            progress.update(len(chunk), sum(len(t) for t in chunk))
    finally:
        for stream in streams.values():
            stream.close()
    counts = {}
    for split in SPLITS:
        offsets = np.concatenate([[0], np.cumsum(lengths[split], dtype=np.int64)])
        np.save(split_files(out, split)[1], offsets)
        counts[split] = {"documents": len(lengths[split]), "tokens": int(offsets[-1]),
                         "max_id": max_id[split]}
    return counts


def _refuse_empty_splits(out: Path, inputs: list[Path], splits: dict[str, dict[str, int]],
                         holdout_every: int) -> None:
    """DataError (the split files removed again, no manifest written) when the train split, or
    the held-out split asked for, has no document."""
    documents = splits["train"]["documents"] + splits["validation"]["documents"]
    problem = None
    if splits["train"]["documents"] == 0:
        problem = f"{', '.join(map(str, inputs))}: no training documents"
    elif holdout_every > 0 and splits["validation"]["documents"] == 0:
        problem = (f"{', '.join(map(str, inputs))}: {documents} document(s), so holdout_every "
                   f"= {holdout_every} holds none out and the validation split would be empty; "
                   f"use a holdout_every of at most {documents} (or 0 for no held-out split)")
    if problem:
        for split in SPLITS:
            for path in split_files(out, split):
                path.unlink(missing_ok=True)
        raise DataError(problem)


def prepare(inputs: list[Path], tokenizer_path: str, out: Path, *, text_field: str = "text",
            holdout_every: int = 50, workers: int | None = None,
            progress: TextIO | None = sys.stderr,
            decode_errors: DecodeErrors = "strict") -> PrepareResult:
    """Tokenize ``inputs`` into the prepared folder ``out`` (a no-op when it is up to date)."""
    if holdout_every < 0 or holdout_every == 1:
        raise DataError(f"holdout_every = {holdout_every}: must be 0 (off) or >= 2")
    start = time.perf_counter()
    files = input_files(inputs)
    input_bytes = sum(f.stat().st_size for f in files)
    tokenizer = build_tokenizer(tokenizer_path)
    recipe = {"files": [str(f) for f in files], "content_hash": content_hash(files),
              "text_field": text_field, "holdout_every": holdout_every,
              "decode_errors": decode_errors}
    identity = {"identity": tokenizer_identity(tokenizer_path), "path": tokenizer_path,
                "vocab_size": tokenizer.vocab_size, "bos_id": tokenizer.bos_id,
                "eos_id": tokenizer.eos_id}
    manifest_path = out / MANIFEST
    if manifest_path.is_file():
        try:
            old = json.loads(manifest_path.read_text())
        except ValueError:  # cut short or corrupt: rewritten below
            old = {}
        if (isinstance(old, dict) and old.get("format") == FORMAT_VERSION
                and old.get("tokenizer") == identity and old.get("inputs") == recipe):
            return PrepareResult(old, True, time.perf_counter() - start, input_bytes)
        manifest_path.unlink()  # the folder is incomplete until the new manifest is written
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    meter = _Progress(input_bytes, progress)
    documents = local_documents(files, text_field, decode_errors)
    chunks = _tokenized_chunks(documents, tokenizer_path, dtype.name, workers or os.cpu_count()
                               or 1)
    splits = _write_splits(out, chunks, holdout_every, meter)
    meter.update(0, 0, final=True)
    _refuse_empty_splits(out, inputs, splits, holdout_every)
    manifest = {"format": FORMAT_VERSION, "tokenizer": identity, "dtype": dtype.name,
                "inputs": recipe, "splits": splits}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return PrepareResult(manifest, False, time.perf_counter() - start, input_bytes)
