"""Qwen3: the llama skeleton (models/llama3/model.py) with per-head q/k RMSNorm before RoPE and,
in the MoE flavors, the shared MoE layer (models/moe/) in place of every feed-forward.

Module names are llama's (``tok_embeddings``, ``layers.N.attention.wq``, ``feed_forward``,
``norm``, ``output``), plus ``attention.q_norm``/``k_norm`` and ``moe``, so the llama pipeline
split, FSDP units and TP styles apply unchanged. The q/k norms act on each head's
``head_dim`` values alone, so a tensor-parallel rank holding whole heads normalises them
locally (parallelize.py).
"""

from __future__ import annotations

import torch

from torchtitan_like.models.block import PreNormBlock
from torchtitan_like.models.feed_forward import FeedForward
from torchtitan_like.models.llama3.model import Attention, Transformer, apply_rope
from torchtitan_like.models.moe import MoE
from torchtitan_like.models.norm import RMSNorm
from torchtitan_like.models.qwen3.args import Qwen3Args


class Qwen3Attention(Attention):
    def __init__(self, args: Qwen3Args):
        super().__init__(args)
        self.q_norm = RMSNorm(args.head_dim, eps=args.norm_eps)
        self.k_norm = RMSNorm(args.head_dim, eps=args.norm_eps)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rope(self.q_norm(q), rope), apply_rope(self.k_norm(k), rope)

    def init_weights(self, init_std: float) -> None:
        super().init_weights(init_std)
        self.q_norm.reset_parameters()
        self.k_norm.reset_parameters()


class Qwen3Block(PreNormBlock):
    """The shared pre-norm block (models/block.py): Qwen3's attention, then SwiGLU
    (``feed_forward``) or MoE (``moe``)."""

    def __init__(self, layer_id: int, args: Qwen3Args):
        attention = Qwen3Attention(args)  # built first: its weights draw first
        super().__init__(layer_id, args, attention,
                         FeedForward(args.dim, args.hidden_dim) if args.moe is None
                         else MoE(args.dim, args.moe_hidden_dim, args.moe, layer_id, args.n_layers))


class Qwen3Model(Transformer):
    """Embedding, Qwen3 blocks, final RMSNorm, head (tied to the embedding where the published
    model ties it); forward, RoPE table and init are the llama skeleton's."""

    block_cls = Qwen3Block
