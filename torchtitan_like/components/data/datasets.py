"""Pack documents into fixed-length samples and give each data-parallel rank its share.

The token stream is ``BOS doc EOS BOS doc EOS ...`` over the documents of one split, cut into
samples of ``seq_len + 1`` tokens (inputs are the first seq_len, labels the last seq_len).
Sharding is by *sample*, in rounds: every round is ``dp x local_batch`` consecutive samples and
rank r takes the r-th block of ``local_batch`` of them. Hence

- one optimizer step always consumes the same global batch, whatever the data-parallel degree
  and the gradient accumulation: a layout's per-step losses compare with one process's;
- at a batch boundary every rank's position in the stream is the same (the end of the round),
  so a saved position is layout-independent and a run can resume under another DP degree.

The price: every rank tokenizes the whole stream and keeps 1/dp of it, cheap for the byte
tokenizer and small corpora; tokenize large corpora once with scripts/prepare_data.py and
train with ``dataset = "tokenized"`` (tokenized.py), where each rank reads only its samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch.utils.data import IterableDataset

from torchtitan_like.components.data.sources import DataError, DocumentSource
from torchtitan_like.components.data.tokenizer import Tokenizer
from torchtitan_like.logging import logger

Split = Literal["train", "validation"]


@dataclasses.dataclass(frozen=True)
class StreamPosition:
    """The next token of the stream is token ``offset`` of document ``doc`` in pass ``epoch``."""

    epoch: int = 0
    doc: int = 0
    offset: int = 0


class PackedDataset(IterableDataset):
    """Yields this rank's (input, label) samples, each a LongTensor of ``seq_len`` tokens.

    Implements ``state_dict``/``load_state_dict``: torchdata's StatefulDataLoader saves and
    restores it, so a resumed run continues with exactly the samples it would have seen.
    """

    def __init__(
        self,
        source: DocumentSource,
        tokenizer: Tokenizer,
        *,
        seq_len: int,
        local_batch_size: int,
        dp_rank: int,
        dp_degree: int,
        split: Split = "train",
        holdout_every: int = 0,
        name: str = "dataset",
    ):
        self.source = source
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        self.dp_rank = dp_rank
        self.dp_degree = dp_degree
        self.split = split
        self.holdout_every = holdout_every
        self.name = name
        self._position = StreamPosition()  # where the current round starts
        self._taken = 0  # samples of this rank's block already yielded in the current round

    def _in_split(self, index: int) -> bool:
        held_out = self.holdout_every > 0 and index % self.holdout_every == self.holdout_every - 1
        return held_out == (self.split == "validation")

    def _documents(self, epoch: int, start: int) -> Iterator[tuple[StreamPosition, list[int]]]:
        """Tokenized documents of the split from document ``start`` of pass ``epoch`` on."""
        while True:
            found = False
            split_index = 0
            for index, text in enumerate(self.source()):
                if not self._in_split(index):
                    continue
                found = True
                if split_index >= start:
                    tokens = [self.tokenizer.bos_id, *self.tokenizer.encode(text),
                              self.tokenizer.eos_id]
                    yield StreamPosition(epoch, split_index, 0), tokens
                split_index += 1
            if not found:
                raise DataError(f"{self.name}: the {self.split} split has no documents")
            epoch, start = epoch + 1, 0
            if self.split == "train":
                logger.info(f"{self.name}: every training document seen; epoch {epoch} "
                            f"(pass {epoch + 1} over the data) begins")

    def _samples(self, position: StreamPosition) -> Iterator[tuple[list[int], StreamPosition]]:
        """Samples of seq_len + 1 tokens from ``position`` on, each with the position after it."""
        documents = self._documents(position.epoch, position.doc)
        doc_position, tokens = next(documents)
        offset = position.offset
        while True:
            sample: list[int] = []
            while len(sample) < self.seq_len + 1:
                take = self.seq_len + 1 - len(sample)
                sample += tokens[offset : offset + take]
                offset += take
                if offset >= len(tokens):
                    doc_position, tokens = next(documents)
                    offset = 0
            yield sample, dataclasses.replace(doc_position, offset=offset)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        samples = self._samples(self._position)
        block = self.local_batch_size
        while True:
            mine = []
            for i in range(self.dp_degree * block):
                sample, after = next(samples)
                if i // block == self.dp_rank:
                    mine.append(sample)
            for sample in mine[self._taken :]:
                self._taken += 1
                if self._taken == block:  # whole block handed out: the round is done for us
                    self._position, self._taken = after, 0
                t = torch.tensor(sample, dtype=torch.long)
                yield t[:-1], t[1:]

    @property
    def epoch(self) -> int:
        """Passes over the split completed where the current batch starts (0 in the first)."""
        return self._position.epoch

    def state_dict(self) -> dict[str, Any]:
        return {"position": dataclasses.asdict(self._position), "taken": self._taken,
                "split": self.split}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("split") != self.split:
            raise DataError(f"{self.name}: saved state is of the {state.get('split')} split")
        self._position = StreamPosition(**state["position"])
        self._taken = state["taken"]
