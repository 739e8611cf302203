"""Activation checkpointing: trade recomputation in backward for activation memory.

Per transformer layer with sequence s, micro-batch b, hidden h, a heads (Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", 2022), 16-bit activations keep

    sbh (34 + 5as/h) bytes   without checkpointing,
    34 sbh                   with selective recomputation (the a*s^2 attention scores are
                             recomputed; what remains is dominated by the matmul inputs),
    2 sbh                    with full recomputation (only the block's input is kept).

Modes: ``full`` wraps every block; ``selective`` with an integer N wraps every N-th block
(memory between none and full, linearly in N); ``selective`` with ``op`` saves the outputs of
matmuls, attention and collectives and recomputes the cheap element-wise ops around them.
Blocks are wrapped in place in their container, so each keeps its name plus a wrapper prefix
that distributed checkpointing strips.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import ActivationCheckpoint

_aten = torch.ops.aten
# Outputs worth keeping: expensive to recompute (matmuls, attention) or to re-communicate.
# Float8 linears (components/float8.py) multiply with _scaled_mm, and each float8 cast reduces
# its operand to an amax (aten.max tensorwise, aten.amax rowwise): a full pass over it.
SAVE_OPS = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten._scaled_mm.default,
    _aten.max.default,
    _aten.amax.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
}


def _save_expensive_ops(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def every_nth_layer(option: str) -> int:
    """The N of ``selective_ac_option = "N"``; ConfigError if it is neither "op" nor N >= 1."""
    if not option.isdigit() or int(option) < 1:
        raise ConfigError(
            f'[activation_checkpoint] selective_ac_option = "{option}": use "op" or a '
            "positive integer N (checkpoint every N-th block)"
        )
    return int(option)


def apply_ac(blocks: nn.ModuleDict, config: ActivationCheckpoint) -> None:
    """Wrap the blocks of ``blocks`` in place according to ``config.mode``."""
    if config.mode == "none":
        return
    op_level = config.mode == "selective" and config.selective_ac_option == "op"
    every = 1 if config.mode == "full" or op_level else every_nth_layer(config.selective_ac_option)
    kwargs = {"preserve_rng_state": False}
    if op_level:
        kwargs["context_fn"] = functools.partial(
            create_selective_checkpoint_contexts, _save_expensive_ops
        )
    for i, (name, block) in enumerate(blocks.items()):
        if i % every == 0:
            blocks[name] = checkpoint_wrapper(block, **kwargs)
