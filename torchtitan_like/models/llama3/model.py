"""Llama 3: RMSNorm, RoPE with Llama 3.1 frequency scaling, grouped-query attention, SwiGLU.

The model and nothing else: no parallelism lives here (see parallelize.py). Blocks sit in an
``nn.ModuleDict`` keyed by layer index and the top-level modules may be ``None``, so that a
pipeline stage is this same class with the other stages' modules removed and parameter names
unchanged (checkpoints rely on that). RoPE is real-valued (cos | sin in one buffer, rotate-half
layout as in HuggingFace's Llama): complex buffers do not survive bf16 casts or inductor, and
one buffer exactly ``max_seq_len`` long is what context parallelism shards beside the tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from torchtitan_like.models.attention_masks import AttentionMask, attention, build_mask
from torchtitan_like.models.block import PreNormBlock, init_blocks_and_head
from torchtitan_like.models.feed_forward import FeedForward
from torchtitan_like.models.llama3.args import Llama3Args, RopeScaling
from torchtitan_like.models.norm import RMSNorm


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d), with Llama 3.1 scaling applied when given."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return freqs
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    wavelen = 2 * math.pi / freqs
    smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    interpolated = (1 - smooth) * freqs / scaling.factor + smooth * freqs
    scaled = torch.where(wavelen > low_wavelen, freqs / scaling.factor, interpolated)
    return torch.where(wavelen < high_wavelen, freqs, scaled)


def rope_cache(head_dim: int, seq_len: int, theta: float, scaling: RopeScaling | None):
    """(seq_len, 2 * head_dim) table: cos of each position's angles, then their sin."""
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64),
                         rope_frequencies(head_dim, theta, scaling))
    angles = torch.cat([angles, angles], dim=-1)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def apply_rope(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """Rotate (bs, seq, heads, head_dim) by position: x*cos + rotate_half(x)*sin."""
    cos, sin = cache[: x.shape[1]].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: Llama3Args):
        super().__init__()
        self.head_dim = args.head_dim
        self.n_rep = args.n_heads // args.kv_heads  # query heads sharing one KV head
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: AttentionMask = None
                ) -> torch.Tensor:
        bs, seq_len, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q, k = self.rotate(self.wq(x).view(bs, seq_len, -1, self.head_dim),
                           self.wk(x).view(bs, seq_len, -1, self.head_dim), rope)
        v = self.wv(x).view(bs, seq_len, -1, self.head_dim)
        k = k.repeat_interleave(self.n_rep, dim=2)
        v = v.repeat_interleave(self.n_rep, dim=2)
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
        return self.wo(out.transpose(1, 2).reshape(bs, seq_len, -1))

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys (bs, seq, heads, head_dim) -> rotated by position (a family that
        normalises them first, e.g. Qwen3, overrides this)."""
        return apply_rope(q, rope), apply_rope(k, rope)

    def init_weights(self, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)


class TransformerBlock(PreNormBlock):
    """The shared pre-norm block (models/block.py) with grouped-query attention and SwiGLU."""

    def __init__(self, layer_id: int, args: Llama3Args):
        super().__init__(layer_id, args, Attention(args),
                         FeedForward(args.dim, args.ffn_hidden_dim))


class Transformer(nn.Module):
    block_cls: type[nn.Module] = TransformerBlock
    """Built as ``block_cls(layer_id, args)`` for every layer (a family with other blocks on
    this skeleton, e.g. Qwen3, sets its own)."""

    def __init__(self, args: Llama3Args):
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict(
            {str(i): self.block_cls(i, args) for i in range(args.n_layers)}
        )
        self.norm: RMSNorm | None = RMSNorm(args.dim, eps=args.norm_eps)
        # A tied head multiplies by the embedding table itself (no second Parameter object that
        # would have to stay shared through to_empty, FSDP and checkpoint loading).
        self.output: nn.Linear | None = (
            None if args.tie_word_embeddings
            else nn.Linear(args.dim, args.vocab_size, bias=False)
        )
        self.register_buffer("rope_cache", self._rope_cache(), persistent=False)

    def _rope_cache(self) -> torch.Tensor:
        a = self.args
        return rope_cache(a.head_dim, a.max_seq_len, a.rope_theta, a.rope_scaling)

    def forward(self, tokens: torch.Tensor, document_ids: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Token ids (bs, seq) -> logits (bs, seq, vocab); a pipeline stage without the
        embedding takes hidden states instead, and one without the head returns them.
        ``document_ids`` (bs, seq) make attention block-causal (models/attention_masks.py);
        only then do the blocks get a ``mask`` keyword, so blocks written for causal
        attention alone keep their ``(x, rope)`` forward."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        masked = {} if document_ids is None else {"mask": build_mask(document_ids)}
        for layer in self.layers.values():
            h = layer(h, self.rope_cache, **masked)
        h = self.norm(h) if self.norm is not None else h
        if self.output is not None:
            return self.output(h)
        if self.args.tie_word_embeddings:
            return F.linear(h, self.tok_embeddings.weight)
        return h

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter and rebuild the RoPE table (after ``to_empty``)."""
        self.rope_cache.copy_(self._rope_cache().to(self.rope_cache.device))
        std = self.args.dim**-0.5
        if self.tok_embeddings is not None:
            if self.args.tie_word_embeddings:  # the table is also the head: the head's init
                nn.init.trunc_normal_(self.tok_embeddings.weight, std=std, a=-3 * std, b=3 * std)
            else:
                nn.init.normal_(self.tok_embeddings.weight)
        init_blocks_and_head(self.layers, self.norm, self.output, self.args.dim)
