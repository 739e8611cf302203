"""Validation: the mean loss over a fixed global held-out set, the same sequences under every
layout, so that the passes of one run, and runs of different layouts, compare.

The set is the first ``[validation] steps`` global batches of the validation split. A global
batch is ``global_batch_size`` sequences, dealt out like a training step's: in rounds of
``dp x local_batch_size`` consecutive samples, rank r taking the r-th block
(components/data/datasets.py). So each rank reads ``steps x microbatches`` (its accumulation
steps) local batches, and together the data-parallel ranks read exactly the first ``steps x
global_batch_size`` sequences, under any dp, local batch size, TP, CP or PP (which share their
rank's batches).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from torchtitan_like.components.data.dataloader import build_dataloader
from torchtitan_like.components.data.tokenizer import Tokenizer
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.utils import all_reduce_sum
from torchtitan_like.protocols.loss import count_labelled_tokens

Batch = tuple[torch.Tensor, torch.Tensor]


def held_out_batches(config: JobConfig, tokenizer: Tokenizer, *, dp_rank: int, dp_degree: int,
                     microbatches: int) -> Iterator[Batch]:
    """This data-parallel rank's share of the held-out set (module docstring)."""
    batches = build_dataloader(config.training, tokenizer, dp_rank=dp_rank, dp_degree=dp_degree,
                               split="validation", seed=config.debug.seed)
    return itertools.islice(batches, config.validation.steps * microbatches)


@torch.no_grad()
def held_out_loss(model_parts: list[nn.Module], batches: Iterator[Batch],
                  loss_sum: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  global_sum: Callable[[torch.Tensor], torch.Tensor], dp: DeviceMesh,
                  device: torch.device) -> float:
    """The mean loss per labelled token over ``batches``, the model in eval mode:
    ``loss_sum(inputs, labels)`` is one microbatch's summed loss (the trainer's forward, with
    its model inputs and contexts), ``global_sum`` adds the ranks' shares of it, and the
    labelled tokens are counted over the data-parallel ranks ``dp``."""
    for part in model_parts:
        part.eval()
    total = torch.zeros((), device=device)
    tokens = torch.zeros((), device=device, dtype=torch.long)
    for inputs, labels in batches:
        inputs, labels = inputs.to(device), labels.to(device)
        tokens += count_labelled_tokens(labels)  # before CP shards the labels
        total += loss_sum(inputs, labels)
    for part in model_parts:
        part.train()
    return (global_sum(total) / all_reduce_sum(tokens, dp)).item()
