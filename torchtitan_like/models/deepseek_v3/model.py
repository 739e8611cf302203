"""DeepSeek-V3: multi-head latent attention (MLA) and DeepSeekMoE blocks after ``n_dense_layers``
dense ones; RMSNorm, SwiGLU, untied head.

The model and nothing else: no parallelism lives here (see parallelize.py). As in llama3, the
blocks sit in an ``nn.ModuleDict`` keyed by layer index and the top-level modules may be
``None``, so a pipeline stage is this same class with parameter names unchanged.

MLA (DeepSeek-V2, section 2.1): keys and values are reconstructed per head from one shared
``kv_lora_rank`` latent (``wkv_a`` -> ``kv_norm`` -> ``wkv_b``), queries optionally from a
``q_lora_rank`` latent; position enters only a decoupled ``qk_rope_head_dim`` part of each
head, whose key part is shared by all heads. RoPE rotates interleaved pairs (x0, x1),
(x2, x3), ... as DeepSeek's weights expect; the rotated halves are returned de-interleaved
(evens then odds) for queries and keys alike, which leaves every q.k product unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from torchtitan_like.models.attention_masks import AttentionMask, attention, build_mask
from torchtitan_like.models.block import PreNormBlock, init_blocks_and_head
from torchtitan_like.models.deepseek_v3.args import DeepSeekV3Args, YarnScaling
from torchtitan_like.models.deepseek_v3.mtp import MTPLoss
from torchtitan_like.models.feed_forward import FeedForward
from torchtitan_like.models.moe import MoE
from torchtitan_like.models.norm import RMSNorm


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention temperature 0.1 * mscale * ln(factor) + 1 (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(rope_dim: int, theta: float, scaling: YarnScaling | None) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d); with YaRN, those that rotate fewer than
    ``beta_slow`` times over the original context are divided by ``factor``, those that
    rotate more than ``beta_fast`` times kept, and the band between blended linearly
    (DeepSeek's ``precompute_freqs_cis``)."""
    freqs = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim))
    if scaling is None:
        return freqs

    def dim_of(rotations: float) -> float:
        return (rope_dim * math.log(scaling.original_max_position / (rotations * 2 * math.pi))
                / (2 * math.log(theta)))

    low = max(math.floor(dim_of(scaling.beta_fast)), 0)
    high = min(math.ceil(dim_of(scaling.beta_slow)), rope_dim - 1)
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float64) - low)
            / max(high - low, 0.001)).clamp(0, 1)
    return freqs / scaling.factor * ramp + freqs * (1 - ramp)


def rope_cache(args: DeepSeekV3Args) -> torch.Tensor:
    """(max_seq_len, rope_dim) table: cos of each position's rope_dim/2 angles, then their
    sin, times YaRN's cos/sin factor mscale(mscale) / mscale(mscale_all_dim) when active."""
    scaling = args.rope_scaling if args.yarn_active else None
    angles = torch.outer(torch.arange(args.max_seq_len, dtype=torch.float64),
                         rope_frequencies(args.qk_rope_head_dim, args.rope_theta, scaling))
    factor = 1.0 if scaling is None else (yarn_mscale(scaling.factor, scaling.mscale)
                                          / yarn_mscale(scaling.factor, scaling.mscale_all_dim))
    return (torch.cat([angles.cos(), angles.sin()], dim=-1) * factor).float()


def apply_rope(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs of (bs, seq, heads, rope_dim) by position; returns the
    rotated pairs' first elements, then their second elements."""
    cos, sin = cache[: x.shape[1]].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, args: DeepSeekV3Args):
        super().__init__()
        self.args = args
        a, heads = args, args.n_heads
        if a.q_lora_rank:
            self.wq_a = nn.Linear(a.dim, a.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(a.q_lora_rank, eps=a.norm_eps)
            self.wq_b = nn.Linear(a.q_lora_rank, heads * a.qk_head_dim, bias=False)
        else:
            self.wq = nn.Linear(a.dim, heads * a.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(a.dim, a.kv_lora_rank + a.qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(a.kv_lora_rank, eps=a.norm_eps)
        self.wkv_b = nn.Linear(a.kv_lora_rank, heads * (a.qk_nope_head_dim + a.v_head_dim),
                               bias=False)
        self.wo = nn.Linear(heads * a.v_head_dim, a.dim, bias=False)
        self.softmax_scale = a.qk_head_dim**-0.5
        if a.yarn_active:  # longer context, flatter softmax: YaRN's temperature, squared
            self.softmax_scale *= yarn_mscale(a.rope_scaling.factor,
                                              a.rope_scaling.mscale_all_dim) ** 2

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: AttentionMask = None
                ) -> torch.Tensor:
        a = self.args
        bs, seq_len, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if a.q_lora_rank else self.wq(x)
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q_nope, q_rope = q.view(bs, seq_len, -1, a.qk_head_dim).split(
            [a.qk_nope_head_dim, a.qk_rope_head_dim], dim=-1)
        latent, k_rope = self.wkv_a(x).split([a.kv_lora_rank, a.qk_rope_head_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(latent)).view(bs, seq_len, -1,
                                                   a.qk_nope_head_dim + a.v_head_dim)
        k_nope, v = kv.split([a.qk_nope_head_dim, a.v_head_dim], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_rope, rope)], dim=-1)
        k_rope = apply_rope(k_rope.unsqueeze(2), rope).expand(-1, -1, k_nope.shape[2], -1)
        k = torch.cat([k_nope, k_rope], dim=-1)
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                        scale=self.softmax_scale)
        return self.wo(out.transpose(1, 2).reshape(bs, seq_len, -1))

    def init_weights(self, init_std: float) -> None:
        for name in ("wq", "wq_a", "wq_b", "wkv_a", "wkv_b"):
            if hasattr(self, name):
                nn.init.trunc_normal_(getattr(self, name).weight, mean=0.0, std=0.02)
        for name in ("q_norm", "kv_norm"):
            if hasattr(self, name):
                getattr(self, name).reset_parameters()
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)


class DeepSeekV3Block(PreNormBlock):
    """The shared pre-norm block (models/block.py): latent attention, then a dense SwiGLU
    (``feed_forward``, the first ``n_dense_layers`` blocks) or a mixture of experts (``moe``)."""

    def __init__(self, layer_id: int, args: DeepSeekV3Args):
        attention = MultiHeadLatentAttention(args)  # built first: its weights draw first
        super().__init__(layer_id, args, attention,
                         FeedForward(args.dim, args.inter_dim) if layer_id < args.n_dense_layers
                         else MoE(args.dim, args.moe_inter_dim, args.moe, layer_id,
                                  args.n_layers + args.mtp_depth))  # MTP blocks are layers too


class DeepSeekV3Model(nn.Module):
    def __init__(self, args: DeepSeekV3Args):
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict(
            {str(i): DeepSeekV3Block(i, args) for i in range(args.n_layers)}
        )
        self.norm: RMSNorm | None = RMSNorm(args.dim, eps=args.norm_eps)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        # multi-token prediction (mtp.py), sharing the embedding module: None without it
        self.mtp: MTPLoss | None = (MTPLoss(args, DeepSeekV3Block, self.tok_embeddings)
                                    if args.mtp_depth else None)
        self.register_buffer("rope_cache", rope_cache(args), persistent=False)

    def forward(self, tokens: torch.Tensor, document_ids: torch.Tensor | None = None, *,
                token_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Token ids (bs, seq) -> logits (bs, seq, vocab); a pipeline stage without the
        embedding takes hidden states instead, and one without the head returns them.
        ``document_ids`` (bs, seq) make attention block-causal (models/attention_masks.py).
        ``token_ids`` and ``labels`` (bs, seq), given to every stage (models/stage_inputs.py),
        feed multi-token prediction in training (the token ids default to ``tokens``)."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        mask = None if document_ids is None else build_mask(document_ids)
        for layer in self.layers.values():
            h = layer(h, self.rope_cache, mask=mask)
        if self.mtp is not None:  # its loss term rides on h (mtp.py); on the last stage under PP
            ids = tokens if token_ids is None else token_ids
            h = self.mtp(h, ids, labels, self.output, self.rope_cache, mask)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter and buffer (after ``to_empty``)."""
        self.rope_cache.copy_(rope_cache(self.args).to(self.rope_cache.device))
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight)
        init_blocks_and_head(self.layers, self.norm, self.output, self.args.dim)
        if self.mtp is not None:  # last: the main model draws the numbers it draws without
            self.mtp.init_weights()
