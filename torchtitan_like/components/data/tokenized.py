"""Training from prepared shards (or a weighted mixture of them): each rank reads only its own.

**Samples of one source.** Sample ``i`` is the ``seq_len + 1`` tokens at offset
``origin + p(i) (seq_len + 1)`` of the source's split stream, the stream repeating pass after
pass: exactly the samples the on-the-fly path (datasets.py) cuts from the same documents. Without
shuffle ``p(i) = i``. With ``shuffle``, samples are permuted within consecutive blocks of
``N = floor(tokens / (seq_len + 1))`` samples (at most one pass): block ``b`` is a permutation
seeded by (seed, source, b), so the order is a pure function of the data, seq_len and seed.

**The mixed stream.** Sample ``n`` of the stream is the next sample of the source
``MixtureSchedule`` picks (mixture.py); a single dataset is a mixture of one source.

**Sharding.** As on the fly: rounds of ``dp x local_batch`` consecutive stream samples, rank r
takes the r-th block of ``local_batch``, so every layout sees the same global batch per step.
Each rank runs the schedule over every sample (integer arithmetic, no data) but reads only its own
block by offset: the bytes a rank reads per step are ``local_batch (seq_len + 1)`` tokens,
independent of the data-parallel degree; nothing is tokenized.

**Position.** At a step boundary every rank has consumed the same stream prefix, so the state
(stream samples ``n``, and per source its samples taken, origin and tokens seen) is the same on
every rank: rank 0 saves it, any layout loads it. With the same seq_len, weights and shuffle the
stream continues exactly, whatever the data-parallel degree, batch size or ``num_workers``.
With another seq_len or weights (shuffle off) each source continues at its first unread token
(``origin += taken x (old seq_len + 1)``) and the schedule starts afresh: no token repeated or
skipped; a shuffled stream refuses such a change (its order is of the old samples).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan_like.components.data.mixture import MixtureSchedule
from torchtitan_like.components.data.prepared import PreparedSplit, check_prepared
from torchtitan_like.components.data.sources import DataError
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Training
from torchtitan_like.logging import logger

Address = tuple[int, int]  # (source, token offset of the sample)


class SourceSamples:
    """Sample index -> token offset in one source's repeating stream (see the module doc)."""

    def __init__(self, split: PreparedSplit, seq_len: int, shuffle_seed: int | None,
                 source: int):
        self.sample_len = seq_len + 1
        self.shuffle_seed, self.source = shuffle_seed, source
        self.per_block = split.num_tokens // self.sample_len
        if shuffle_seed is not None and self.per_block == 0:
            raise DataError(f"{split.name}: {split.num_tokens} tokens hold no whole sample of "
                            f"{self.sample_len} tokens to shuffle")
        self.origin = 0
        self._block: tuple[int, np.ndarray] | None = None

    def offset(self, index: int) -> int:
        if self.shuffle_seed is None:
            return self.origin + index * self.sample_len
        block, within = divmod(index, self.per_block)
        if self._block is None or self._block[0] != block:
            rng = np.random.default_rng([self.shuffle_seed, self.source, block])
            self._block = (block, rng.permutation(self.per_block))
        return self.origin + (block * self.per_block + int(self._block[1][within])) \
            * self.sample_len


class _ReadSamples(Dataset):
    """Item: the addresses of one local batch -> (inputs, labels), each (batch, seq_len)."""

    def __init__(self, splits: list[PreparedSplit], seq_len: int):
        self.splits, self.sample_len = splits, seq_len + 1

    def __getitem__(self, addresses: tuple[Address, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(np.stack(
            [self.splits[source].read(offset, self.sample_len) for source, offset in addresses]))
        return rows[:, :-1], rows[:, 1:]


def _rank_batches(schedule: MixtureSchedule, sources: list[SourceSamples], dp_rank: int,
                  dp_degree: int, batch: int) -> Iterator[tuple[Address, ...]]:
    """This rank's block of each round, as addresses; the others' samples are only counted."""
    while True:
        mine = []
        for i in range(dp_degree * batch):
            source = schedule.next()
            if i // batch == dp_rank:
                index = schedule.counts[source] - 1
                mine.append((source, sources[source].offset(index)))
        yield tuple(mine)


class TokenizedLoader:
    """Yields this rank's (inputs, labels) batches; ``state_dict`` is the global position."""

    def __init__(self, folders: dict[str, Path], weights: dict[str, float], *, split: str,
                 seq_len: int, local_batch_size: int, dp_rank: int, dp_degree: int,
                 seed: int, shuffle: bool, num_workers: int = 0):
        self.names = list(folders)
        self.splits = [PreparedSplit(folders[name], split) for name in self.names]
        self.shuffle_seed = seed if shuffle else None
        self.sources = [SourceSamples(s, seq_len, self.shuffle_seed, i)
                        for i, s in enumerate(self.splits)]
        self.weights, self.seed = dict(weights), seed
        self.schedule = MixtureSchedule(weights, seed)  # the consumed prefix of the stream
        self.seq_len, self.batch = seq_len, local_batch_size
        self.dp_rank, self.dp_degree, self.num_workers = dp_rank, dp_degree, num_workers
        self.tokens = [0] * len(self.names)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Workers read ahead on a copy of the schedule; the position advances per batch
        handed out, so a state saved between batches is exact whatever ``num_workers``."""
        addresses = _rank_batches(copy.deepcopy(self.schedule), self.sources, self.dp_rank,
                                  self.dp_degree, self.batch)
        loader = StatefulDataLoader(_ReadSamples(self.splits, self.seq_len), sampler=addresses,
                                    batch_size=None, num_workers=self.num_workers)
        for batch in loader:
            for _ in range(self.dp_degree * self.batch):
                self.tokens[self.schedule.next()] += self.seq_len
            yield batch

    @property
    def epoch(self) -> int:
        """The pass over the data the stream is in: that of the source furthest along (with a
        mixture, the sources repeat at different times)."""
        return max((source.origin + taken * source.sample_len) // split.num_tokens
                   for source, split, taken in zip(self.sources, self.splits,
                                                   self.schedule.counts, strict=True))

    def bytes_read(self) -> int:
        """Bytes this process read from the token files (with workers: only its own reads)."""
        return sum(s.bytes_read for s in self.splits)

    def mixture_metrics(self) -> dict[str, float]:
        """Tokens seen per source over all ranks, and their realised shares (mixtures only)."""
        total = sum(self.tokens)
        if len(self.names) < 2 or total == 0:
            return {}
        metrics: dict[str, float] = {}
        for name, tokens in zip(self.names, self.tokens, strict=True):
            metrics[f"data_tokens/{name}"] = tokens
            metrics[f"data_share/{name}"] = tokens / total
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "weights": self.weights,
                "shuffle_seed": self.shuffle_seed, **self.schedule.state_dict(),
                "origins": {n: s.origin for n, s in zip(self.names, self.sources, strict=True)},
                "tokens": dict(zip(self.names, self.tokens, strict=True)),
                "content": {n: s.content for n, s in zip(self.names, self.splits, strict=True)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, split in zip(self.names, self.splits, strict=True):
            if state["content"].get(name, split.content) != split.content:
                raise DataError(f"source {name!r} was prepared again from other inputs since "
                                "the checkpoint; its saved position does not apply")
        self.tokens = [state["tokens"].get(name, 0) for name in self.names]
        same = (state["seq_len"], state["weights"], state["shuffle_seed"]) == (
            self.seq_len, self.weights, self.shuffle_seed)
        if same:
            self.schedule.load_state_dict(state)
            for name, source in zip(self.names, self.sources, strict=True):
                source.origin = state["origins"].get(name, 0)
            return
        if self.shuffle_seed is not None or state["shuffle_seed"] is not None:
            raise DataError("a shuffled stream cannot continue under another seq_len, mixture "
                            "or shuffle seed; keep them, or do not load the data position")
        for name, source in zip(self.names, self.sources, strict=True):  # first unread token
            taken = state["counts"].get(name, 0) * (state["seq_len"] + 1)
            source.origin = state["origins"].get(name, 0) + taken
        logger.info("data: seq_len or mixture changed; each source continues at its first "
                    "unread token, the mixture schedule starts afresh")


def source_folders(training: Training) -> dict[str, Path]:
    """Name -> prepared folder: the mixture's ``dataset_path/<name>``, or dataset_path itself."""
    root = Path(training.dataset_path)
    if training.mixture:
        return {name: root / name for name in training.mixture}
    return {root.name or "data": root}


def build_tokenized_loader(training: Training, seed: int, *, dp_rank: int, dp_degree: int,
                           split: str) -> TokenizedLoader:
    folders = source_folders(training)
    weights = training.mixture or {name: 1.0 for name in folders}
    return TokenizedLoader(folders, weights, split=split, seq_len=training.seq_len,
                           local_batch_size=training.local_batch_size, dp_rank=dp_rank,
                           dp_degree=dp_degree, seed=seed, shuffle=training.shuffle,
                           num_workers=training.num_workers if split == "train" else 0)


def _check_source_name(name: str) -> None:
    """A mixture source is a folder directly under dataset_path: a name with a separator or
    ``..`` would read a folder elsewhere."""
    if not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise ConfigError(f"[training] mixture: source name {name!r} must be the name of a "
                          "folder directly under [training] dataset_path (no / or ..)")


def validate_data_options(training: Training, tokenizer_path: str, vocab_size: int) -> None:
    """Start-up checks of the tokenized path's switches (ConfigError naming the fix); the
    prepared folders' files are checked by checks.check_data."""
    if training.dataset != "tokenized":
        return
    if not training.dataset_path:
        raise ConfigError("[training] dataset = tokenized needs [training] dataset_path (a "
                          "folder written by scripts/prepare_data.py)")
    if training.num_workers < 0:
        raise ConfigError(f"[training] num_workers = {training.num_workers}: must be >= 0")
    for name in training.mixture:
        _check_source_name(name)
    MixtureSchedule(training.mixture or {"data": 1.0}, 0)  # the weights' own checks
    for folder in source_folders(training).values():
        manifest = check_prepared(folder, tokenizer_path, vocab_size)
        prepared = manifest["inputs"]["holdout_every"]
        if prepared != training.holdout_every:
            raise ConfigError(f"{folder} holds out every {prepared}th document (fixed when "
                              f"preparing); set [training] holdout_every = {prepared}")


def report_mixture(loader: Any) -> dict[str, float]:
    """The realised proportions of a mixture (tokens seen per source), logged and returned for
    metrics.jsonl; nothing for a single source or the on-the-fly path."""
    metrics = loader.mixture_metrics() if isinstance(loader, TokenizedLoader) else {}
    shares = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("data_share/")}
    if shares:
        logger.info("data mixture (share of tokens seen): "
                    + ", ".join(f"{name} {100 * share:.2f}%" for name, share in shares.items()))
    return metrics
