"""The transformer block every built-in family shares: pre-norm attention, then a pre-norm
feed-forward, each added to the residual stream.

    h   = x + attention(attention_norm(x), rope, mask)
    out = h + ffn(ffn_norm(h))

A family plugs in its attention (any module called as ``attention(x, rope, mask=mask)`` with
``init_weights(std)``: llama's grouped-query attention, Qwen3's with q/k norms, DeepSeek's
latent attention) and its feed-forward: a mixture of experts (models/moe/), kept as ``moe``,
or any other (the SwiGLU of models/feed_forward.py), kept as ``feed_forward``. The module
names are part of the contract: checkpoints, the HF adapters, the TP plans and the FSDP units
all name ``layers.N.attention_norm``, ``layers.N.attention``, ``layers.N.ffn_norm`` and
``layers.N.feed_forward`` / ``layers.N.moe``.

Initialisation (after ``to_empty``): the norms to ones, then the attention and the
feed-forward, each told the std of its output projections. That std shrinks with depth,
``0.02 / sqrt(2 * depth)``: each of a block's two residual branches adds one term to the
stream, so after ``depth`` blocks the stream sums ``2 * depth`` of them, and scaling their
std by ``1 / sqrt(2 * depth)`` keeps its variance from growing with depth (GPT-2's rule; with
``depth_init`` each block counts its own depth, ``layer_id + 1``, else the model's).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from torchtitan_like.models.attention_masks import AttentionMask
from torchtitan_like.models.moe import MoE
from torchtitan_like.models.norm import RMSNorm


class BlockArgs(Protocol):
    """What the skeleton reads from a family's hyper-parameters."""

    dim: int
    norm_eps: float
    n_layers: int
    depth_init: bool


def init_std(layer_id: int, args: BlockArgs) -> float:
    """The std of a block's output projections (module docstring)."""
    depth = layer_id + 1 if args.depth_init else args.n_layers
    return 0.02 / (2 * depth) ** 0.5


class PreNormBlock(nn.Module):
    """The shared skeleton (module docstring) around a family's ``attention`` and ``ffn``."""

    def __init__(self, layer_id: int, args: BlockArgs, attention: nn.Module, ffn: nn.Module):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = attention
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.moe_enabled = isinstance(ffn, MoE)
        if self.moe_enabled:
            self.moe = ffn
        else:
            self.feed_forward = ffn
        self.init_std = init_std(layer_id, args)

    @property
    def ffn(self) -> nn.Module:
        """The feed-forward this block runs: ``moe`` or ``feed_forward``."""
        return self.moe if self.moe_enabled else self.feed_forward

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: AttentionMask = None
                ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask=mask)
        return h + self.ffn(self.ffn_norm(h))

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.init_std)
        self.ffn.init_weights(self.init_std)


def init_blocks_and_head(layers: nn.ModuleDict, norm: nn.Module | None,
                         head: nn.Linear | None, dim: int) -> None:
    """A trunk's weights after its embedding, in the order their random numbers are drawn:
    every block, the final norm, then an untied head (std ``dim**-0.5``, cut at 3 std). A
    module a pipeline stage dropped (None) is skipped."""
    for layer in layers.values():
        layer.init_weights()
    if norm is not None:
        norm.reset_parameters()
    if head is not None:
        std = dim**-0.5
        nn.init.trunc_normal_(head.weight, std=std, a=-3 * std, b=3 * std)
