"""The on-disk format of a prepared (tokenized-once) dataset, and reading it by offset.

A folder written by ``scripts/prepare_data.py`` holds, per split (``train``, ``validation``):

- ``<split>.bin``: the split's token stream ``BOS doc EOS BOS doc EOS ...`` as one flat array of
  the smallest unsigned dtype that holds the vocabulary (``uint8``/``uint16``/``uint32``),
  read through ``numpy.memmap`` (the OS pages in only the bytes a rank touches);
- ``<split>.idx.npy``: the document index, int64 start offsets of the documents plus the end;
- ``manifest.json``, written last (a folder without it is incomplete): the tokenizer's identity
  (a hash of its files) and vocabulary, the dtype, per-split document and token counts, the
  inputs' content hash and the held-out rule (every ``holdout_every``-th document, as the
  on-the-fly path splits).

The stream is the same token sequence the on-the-fly path (datasets.py) builds from the same
documents, so both cut the same samples from it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from torchtitan_like.components.data.sources import DataError
from torchtitan_like.config.errors import ConfigError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "validation")


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer dtype whose range holds every id below ``vocab_size``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise DataError(f"a vocabulary of {vocab_size} tokens does not fit 32-bit ids")


def tokenizer_identity(tokenizer_path: str) -> str:
    """``byte`` for the byte tokenizer, else a SHA-256 of ``tokenizer.json`` and the
    ``tokenizer_config.json`` beside it (which sets BOS/EOS): equal iff the ids are the same."""
    if not tokenizer_path:
        return "byte"
    path = Path(tokenizer_path)
    path = path / "tokenizer.json" if path.is_dir() else path
    digest = hashlib.sha256(path.read_bytes())
    config = path.parent / "tokenizer_config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    return "sha256:" + digest.hexdigest()


def split_files(folder: Path, split: str) -> tuple[Path, Path]:
    """(token stream, document index) of ``split`` in a prepared folder."""
    return folder / f"{split}.bin", folder / f"{split}.idx.npy"


_REQUIRED: tuple[tuple[tuple[str, ...], type], ...] = (
    (("format",), int), (("tokenizer", "identity"), str), (("tokenizer", "vocab_size"), int),
    (("dtype",), str), (("inputs", "content_hash"), str), (("inputs", "holdout_every"), int),
    *((("splits", split, count), int) for split in SPLITS for count in ("documents", "tokens")),
)
"""The manifest entries the readers use, and their types."""


def _manifest_problem(manifest: Any) -> str | None:
    """What is missing or mistyped in a parsed manifest, or None."""
    for path, tp in _REQUIRED:
        value = manifest
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return f"no {'.'.join(path)!r} entry"
            value = value[key]
        if not isinstance(value, tp) or isinstance(value, bool):
            return f"{'.'.join(path)} = {value!r} is not of type {tp.__name__}"
    return None


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a prepared folder; ConfigError if it is missing, unreadable, cut short,
    lacks an entry the readers use, or is of another format."""
    path = folder / MANIFEST
    again = f"run scripts/prepare_data.py INPUT... --out {folder} again"
    if not path.is_file():
        raise ConfigError(f"{folder}: not a prepared dataset (no {MANIFEST}); write it with "
                          f"scripts/prepare_data.py INPUT... --out {folder}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError) as e:
        raise ConfigError(f"{path} is unreadable or cut short ({e}); {again}") from None
    if isinstance(manifest, dict) and manifest.get("format") != FORMAT_VERSION:
        raise ConfigError(f"{folder}: prepared with format {manifest.get('format')}, this "
                          f"version reads {FORMAT_VERSION}; {again}")
    problem = _manifest_problem(manifest)
    if problem:
        raise ConfigError(f"{path} is not a complete manifest ({problem}); {again}")
    return manifest


def check_prepared(folder: Path, tokenizer_path: str, vocab_size: int) -> dict[str, Any]:
    """The manifest, once checked against the job's tokenizer: other ids would train silently on
    wrong tokens, so a mismatch is refused with the two identities."""
    manifest = read_manifest(folder)
    saved = manifest["tokenizer"]
    here = tokenizer_identity(tokenizer_path)
    if saved["identity"] != here or saved["vocab_size"] != vocab_size:
        raise ConfigError(
            f"{folder} was tokenized by tokenizer {saved['identity']} ({saved['vocab_size']} "
            f"tokens) but [model] tokenizer_path = {tokenizer_path!r} is {here} ({vocab_size} "
            "tokens): prepare the data with this tokenizer, or train with that one")
    return manifest


class PreparedSplit:
    """One split's token stream, read by offset; the stream repeats (pass after pass), as the
    on-the-fly path continues into the next pass. Counts the bytes it reads (benchmarks).

    The memmap is opened lazily, so a copy sent to a data-loading worker carries only the path.
    """

    def __init__(self, folder: Path, split: str):
        manifest = read_manifest(folder)
        self.name = folder.name
        self.path = split_files(folder, split)[0]
        self.dtype = np.dtype(manifest["dtype"])
        self.num_tokens = int(manifest["splits"][split]["tokens"])
        self.content = manifest["inputs"]["content_hash"]
        if self.num_tokens == 0:
            raise DataError(f"{folder}: the {split} split has no documents")
        self.bytes_read = 0
        self._tokens: np.memmap | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}

    def read(self, offset: int, length: int) -> np.ndarray:
        """Tokens ``offset .. offset + length`` of the repeating stream, as int64."""
        if self._tokens is None:  # the manifest's length: a file cut short since is an error
            try:
                self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r",
                                         shape=(self.num_tokens,))
            except (OSError, ValueError) as e:
                raise DataError(f"{self.path}: cannot be read as {self.num_tokens:,} ids of "
                                f"{self.dtype} ({e})") from None
        start = offset % self.num_tokens
        if start + length <= self.num_tokens:
            out = self._tokens[start : start + length]
        else:  # across the end of a pass
            out = np.take(self._tokens, np.arange(start, start + length) % self.num_tokens)
        self.bytes_read += length * self.dtype.itemsize
        return out.astype(np.int64)
