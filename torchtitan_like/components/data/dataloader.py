"""Batches of this rank's samples through torchdata's StatefulDataLoader (exact resume).

Prepared shards (``dataset = "tokenized"``) are read by tokenized.py; the other datasets are
tokenized on the fly (datasets.py)."""

from __future__ import annotations

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
