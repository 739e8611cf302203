"""Where documents come from: text shipped with CPython, or local .txt/.jsonl/.json/.parquet
files.

A source is a zero-argument callable returning a fresh iterator over document strings, in a
fixed order; packing and sharding (datasets.py) only ever see that interface. Text is UTF-8,
decoded strictly unless ``[training] decode_errors = "replace"``: a byte that is not UTF-8 is
otherwise trained on as U+FFFD without a word. Every problem found while reading (a record
that is not JSON, a missing text field, a byte that is not UTF-8, an unreadable file) is one
``DataError`` naming the file and line.
"""

from __future__ import annotations

import functools
import json
import re
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from torchtitan_like.config.errors import ConfigError

DocumentSource = Callable[[], Iterator[str]]

SUPPORTED_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
"""``.json`` is read as JSON lines, as ``.jsonl`` (TorchTitan's ``c4_test/data.json`` shape)."""

DecodeErrors = Literal["strict", "replace"]

_MODULE_DOCSTRING = re.compile(r'\A(?:\s*#[^\n]*\n|\s*\n)*\s*[rRuU]?("""|\'\'\')(.*?)\1', re.S)
_SKIPPED_STDLIB_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


class DataError(ValueError):
    """A dataset that cannot feed training; the message names the file and the problem."""


@functools.cache
def cpython_documents() -> tuple[str, ...]:
    """English text every Python install carries, no download needed (about 0.7 MB): the
    reference-manual topics of ``pydoc_data`` and the module docstrings of the standard library
    (those over 200 characters). The text differs slightly between Python versions."""
    from pydoc_data.topics import topics

    docs = [topics[key] for key in sorted(topics)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if _SKIPPED_STDLIB_DIRS.intersection(path.relative_to(stdlib).parts):
            continue
        match = _MODULE_DOCSTRING.match(path.read_text(encoding="utf-8", errors="replace"))
        if match and len(match.group(2).strip()) > 200:
            docs.append(match.group(2).strip())
    return tuple(docs)


def data_files(path: Path) -> list[Path]:
    """The supported files at ``path`` (a file, or a folder searched recursively), sorted."""
    if path.is_file():
        files = [path] if path.suffix in SUPPORTED_SUFFIXES else []
    else:
        files = sorted(p for p in path.rglob("*") if p.suffix in SUPPORTED_SUFFIXES)
    return files


def _not_utf8(path: Path, data: bytes, error: UnicodeDecodeError, line_no: int = 1) -> DataError:
    """The DataError of a byte that is not UTF-8: file, line and column, and the way out."""
    before = data[: error.start]
    line = line_no + before.count(b"\n")
    column = error.start - (before.rfind(b"\n") + 1) + 1
    return DataError(f"{path}:{line}: byte {data[error.start]:#04x} at column {column} is not "
                     "UTF-8; fix the file, or read such bytes as U+FFFD with [training] "
                     "decode_errors = \"replace\"")


def _text_document(path: Path, errors: DecodeErrors) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise _not_utf8(path, data, e) from None


def _jsonl_documents(path: Path, field: str, errors: DecodeErrors) -> Iterator[str]:
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8", errors=errors)
            except UnicodeDecodeError as e:
                raise _not_utf8(path, raw, e, line_no) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                array = " (the file is one JSON document; one JSON object per line is expected)"
                raise DataError(f"{path}:{line_no}: not valid JSON ({e})"
                                + (array if line_no == 1 and line.lstrip()[:1] == "[" else "")
                                ) from None
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise DataError(f"{path}:{line_no}: no text field {field!r} in this record")
            yield record[field]


def _parquet_documents(path: Path, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DataError(f"{path}: parquet needs pyarrow: pip install -e '.[parquet]'") from e
    try:
        table = pq.ParquetFile(path)
    except Exception as e:  # pyarrow's ArrowInvalid and friends
        raise DataError(f"{path}: not a readable Parquet file ({' '.join(str(e).split())})"
                        ) from None
    if field not in table.schema_arrow.names:
        raise DataError(f"{path}: no column {field!r} (columns: {table.schema_arrow.names})")
    for batch in table.iter_batches(columns=[field]):
        yield from (text for text in batch.column(0).to_pylist() if text is not None)


def _file_documents(path: Path, field: str, errors: DecodeErrors) -> Iterator[str]:
    if path.suffix == ".txt":
        yield _text_document(path, errors)
    elif path.suffix in (".jsonl", ".json"):
        yield from _jsonl_documents(path, field, errors)
    else:
        yield from _parquet_documents(path, field)


def local_documents(files: list[Path], field: str,
                    errors: DecodeErrors = "strict") -> Iterator[str]:
    """The documents of ``files`` in order: a .txt file is one document, a .jsonl/.json line
    one record, a .parquet row one value of the column ``field``."""
    for path in files:
        try:
            yield from _file_documents(path, field, errors)
        except OSError as e:  # vanished, unreadable, a folder named like a file ...
            raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None


def check_dataset_path(dataset_path: str) -> list[Path]:
    """The files a ``local`` dataset will read; ConfigError if there are none."""
    if not dataset_path:
        raise ConfigError("[training] dataset = local needs [training] dataset_path")
    path = Path(dataset_path)
    if not path.exists():
        raise ConfigError(f"[training] dataset_path: {path} does not exist")
    files = data_files(path)
    if not files:
        raise ConfigError(
            f"[training] dataset_path: no {'/'.join(SUPPORTED_SUFFIXES)} files at {path}"
        )
    return files


def build_document_source(dataset: str, dataset_path: str, text_field: str,
                          decode_errors: DecodeErrors = "strict") -> DocumentSource:
    if dataset == "cpython_docs":
        return lambda: iter(cpython_documents())
    files = check_dataset_path(dataset_path)
    return functools.partial(local_documents, files, text_field, decode_errors)
