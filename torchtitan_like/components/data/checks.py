"""Start-up checks of the training data, so that a bad dataset is one line before the job
starts rather than a traceback at step 1 (or at the first validation, steps later).

Each check reads only as far as it must: every file up to its first non-empty document (which
proves it readable, in a supported format, with the text field), and the first
``holdout_every`` documents when validation needs a held-out split. A malformed record further
into a file is still found only when training reaches it: a ``DataError`` naming its file and
line. Prepared (tokenized) folders are checked against their manifest (prepared_checks.py).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from torchtitan_like.components.data.prepared_checks import check_prepared_folder
from torchtitan_like.components.data.sources import (
    DataError,
    build_document_source,
    check_dataset_path,
    cpython_documents,
    local_documents,
)
from torchtitan_like.components.data.tokenized import source_folders
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Training

DATA_NAMED_BY: dict[str, tuple[str, ...]] = {"dataset_path": ("local", "tokenized"),
                                              "mixture": ("tokenized",)}
"""The [training] keys that name the data, and the datasets that read them."""


def _check_file(path: Path, training: Training) -> None:
    try:
        documents = local_documents([path], training.dataset_text_field, training.decode_errors)
        if not any(text.strip() for text in documents):
            raise ConfigError(f"[training] dataset_path: {path} holds no non-empty document")
    except DataError as e:
        raise ConfigError(f"[training] dataset_path: {e}") from e


def _check_held_out(training: Training) -> None:
    """The held-out split is documents holdout_every-1, 2*holdout_every-1, ...: it is empty
    when the dataset has fewer than holdout_every documents."""
    source = build_document_source(training.dataset, training.dataset_path,
                                   training.dataset_text_field, training.decode_errors)
    try:
        count = sum(1 for _ in itertools.islice(source(), training.holdout_every))
    except DataError as e:
        raise ConfigError(f"[training] dataset_path: {e}") from e
    if count < training.holdout_every:
        name = training.dataset_path or training.dataset
        raise ConfigError(
            f"[validation] enable: the held-out split is empty: {name} has {count} "
            f"document(s) and [training] holdout_every = {training.holdout_every} holds out "
            "every holdout_every-th; lower holdout_every or set [validation] enable = false")


def check_data(training: Training, validation: bool, vocab_size: int) -> None:
    """ConfigError unless the dataset can feed the job: every source readable with the text
    field and holding a non-empty document, and (``validation``) a held-out split with a
    document; a prepared folder consistent with its manifest, its ids below ``vocab_size``
    (the tokenizer's). A [training] key another dataset reads is a setting without effect
    (config/switches.py), except the two that name the data: a ``dataset_path`` or ``mixture``
    the dataset would not read is refused (beside the default ``cpython_docs`` the job would
    train on CPython's docs, not the data the user named)."""
    for name, readers in DATA_NAMED_BY.items():
        if getattr(training, name) and training.dataset not in readers:
            wanted = " or ".join(f'"{r}"' for r in readers)
            raise ConfigError(
                f"[training] {name} names the data to train on, but [training] dataset = "
                f"{training.dataset!r} does not read it: set [training] dataset = {wanted}, "
                f"or remove {name}")
    if training.dataset == "tokenized":
        for folder in source_folders(training).values():
            check_prepared_folder(folder, vocab_size, validation)
        return
    if training.dataset == "local":
        for path in check_dataset_path(training.dataset_path):
            _check_file(path, training)
    if validation:
        _check_held_out(training)


def describe_data(training: Training) -> str:
    """The dataset and its size, as far as it is cheap to know (no file is read)."""
    if training.dataset == "cpython_docs":
        docs = cpython_documents()
        return f"cpython_docs ({len(docs):,} documents, {sum(map(len, docs)) / 1e6:.1f} M chars)"
    if training.dataset == "tokenized":
        return f"{training.dataset_path} (prepared tokens, see its manifest.json)"
    files = check_dataset_path(training.dataset_path)
    size = sum(path.stat().st_size for path in files)
    return f"{training.dataset_path} ({len(files)} file(s), {size / 2**20:.1f} MiB on disk)"
