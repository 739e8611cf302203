"""Cross-entropy normalised by the number of tokens in the *global* batch.

A step's loss is L = (1/T) * sum over every microbatch m, every data/context-parallel rank r and
every labelled token t of ce(m, r, t), where T counts the labelled tokens of the whole step.
Each microbatch therefore contributes sum_t ce / T, and its gradients simply add up over
microbatches (accumulation) and over ranks (FSDP sums, see distributed/fsdp.py). Averaging each
microbatch by its own token count instead would weight tokens unequally whenever microbatches
hold different numbers of labelled tokens, and would make the loss depend on the layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

IGNORE_INDEX = -100
"""Label of a position that is not trained on (no prediction is scored there)."""


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed (not averaged) token cross-entropy, computed in fp32.

    Vocab-sharded logits (a DTensor, under loss parallel) give a loss replicated over the TP
    ranks; its local value is returned, so the trainer only ever sees plain tensors.
    """
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(0, 1),
        reduction="sum", ignore_index=IGNORE_INDEX,
    )
    return loss.to_local() if isinstance(loss, DTensor) else loss


def count_labelled_tokens(labels: torch.Tensor) -> torch.Tensor:
    return (labels != IGNORE_INDEX).sum()
