"""Batches of this rank's samples through torchdata's StatefulDataLoader (exact resume).

Prepared shards (``dataset = "tokenized"``) are read by tokenized.py; the other datasets are
tokenized on the fly (datasets.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan_like.components.data.datasets import PackedDataset, Split
from torchtitan_like.components.data.sources import build_document_source
from torchtitan_like.components.data.tokenized import TokenizedLoader, build_tokenized_loader
from torchtitan_like.components.data.tokenizer import Tokenizer
from torchtitan_like.config.job_config import Training


def build_dataloader(
    config: Training,
    tokenizer: Tokenizer,
    *,
    dp_rank: int,
    dp_degree: int,
    split: Split = "train",
    seed: int = 0,
) -> StatefulDataLoader | TokenizedLoader:
    """Yields (inputs, labels), each (local_batch_size, seq_len). On the fly, samples are
    packed in the main process (num_workers = 0): the position in the stream is then one exact
    state. ``seed`` orders a shuffled or mixed prepared dataset."""
    if config.dataset == "tokenized":
        return build_tokenized_loader(config, seed, dp_rank=dp_rank, dp_degree=dp_degree,
                                      split=split)
    source = build_document_source(config.dataset, config.dataset_path, config.dataset_text_field)
    dataset = PackedDataset(
        source,
        tokenizer,
        seq_len=config.seq_len,
        local_batch_size=config.local_batch_size,
        dp_rank=dp_rank,
        dp_degree=dp_degree,
        split=split,
        holdout_every=config.holdout_every,
        name=config.dataset_path or config.dataset,
    )
    return StatefulDataLoader(dataset, batch_size=config.local_batch_size, num_workers=0)


def data_epoch(loader: StatefulDataLoader | TokenizedLoader) -> int:
    """The pass over the training data the next sample comes from (0 = the first pass)."""
    return loader.epoch if isinstance(loader, TokenizedLoader) else loader.dataset.epoch


class StepBatches:
    """Each step's microbatches, read in order from the trainer's loader, and the loader's
    position as one state (the checkpoint's ``dataloader``). Loading a state (a resume, or a
    replica group healing from a peer, distributed/fault_tolerance.py) makes the next step
    read from there. ``loader`` returns the loader to read, looked up at every (re)start: a
    loader the trainer was given after it was built is the one read."""

    def __init__(self, loader: Callable[[], Any], microbatches: int):
        self.loader, self.microbatches = loader, microbatches
        self._batches: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None

    def next_step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The next step's (inputs, labels) microbatches."""
        if self._batches is None:
            self._batches = iter(self.loader())
        return [next(self._batches) for _ in range(self.microbatches)]

    def state_dict(self) -> dict[str, Any]:
        return self.loader().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader().load_state_dict(state)
        self._batches = None
