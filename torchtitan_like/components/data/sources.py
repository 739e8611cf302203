"""Where documents come from: text shipped with CPython, or local .txt/.jsonl/.parquet files.

A source is a zero-argument callable returning a fresh iterator over document strings, in a
fixed order; packing and sharding (datasets.py) only ever see that interface.
"""

from __future__ import annotations

import functools
import json
import re
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

from torchtitan_like.config.errors import ConfigError

DocumentSource = Callable[[], Iterator[str]]

SUPPORTED_SUFFIXES = (".txt", ".jsonl", ".parquet")

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


def _jsonl_documents(path: Path, field: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{line_no}: not valid JSON ({e})") from e
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise DataError(f"{path}:{line_no}: no text field {field!r} in this record")
            yield record[field]


def _parquet_documents(path: Path, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DataError(f"{path}: parquet needs pyarrow: pip install -e '.[parquet]'") from e
    table = pq.ParquetFile(path)
    if field not in table.schema_arrow.names:
        raise DataError(f"{path}: no column {field!r} (columns: {table.schema_arrow.names})")
    for batch in table.iter_batches(columns=[field]):
        yield from (text for text in batch.column(0).to_pylist() if text is not None)


def local_documents(files: list[Path], field: str) -> Iterator[str]:
    for path in files:
        if path.suffix == ".txt":
            yield path.read_text(encoding="utf-8", errors="replace")
        elif path.suffix == ".jsonl":
            yield from _jsonl_documents(path, field)
        else:
            yield from _parquet_documents(path, field)


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


def build_document_source(dataset: str, dataset_path: str, text_field: str) -> DocumentSource:
    if dataset == "cpython_docs":
        return lambda: iter(cpython_documents())
    files = check_dataset_path(dataset_path)
    return functools.partial(local_documents, files, text_field)
