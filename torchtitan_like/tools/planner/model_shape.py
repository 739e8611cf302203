"""What the planner reads of a model: a decoder-only transformer's shapes, from its args
(the dense sizes, the MoE sizes of moe.py, multi-head latent attention's of attention.py)."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from torchtitan_like.tools.planner.moe import attention_fields, moe_fields

if TYPE_CHECKING:
    from torchtitan_like.protocols.model_args import BaseModelArgs


@dataclasses.dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention's sizes (DeepSeek-V2/V3 args)."""

    q_lora_rank: int
    """Query latent width (0: queries projected directly)."""
    kv_lora_rank: int
    """Key/value latent width."""
    rope_dim: int
    """Decoupled RoPE part of each query/key head (one RoPE key shared by all heads)."""
    nope_dim: int
    """Position-free part of each query/key head."""
    v_head_dim: int
    """Value (and output) head size."""


def latent_attention(args: Any) -> LatentAttention | None:
    """MLA's sizes for args that have them (``kv_lora_rank``), else None."""
    if not hasattr(args, "kv_lora_rank"):
        return None
    return LatentAttention(int(args.q_lora_rank), int(args.kv_lora_rank),
                           int(args.qk_rope_head_dim), int(args.qk_nope_head_dim),
                           int(args.v_head_dim))



@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the planner reads of a decoder-only transformer; built from a model's args."""

    n_layers: int
    dim: int
    n_heads: int
    head_dim: int
    kv_heads: int
    ffn_hidden_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    num_params: int
    args: BaseModelArgs
    moe_layers: int = 0
    """Blocks whose feed-forward is a mixture of experts (tools/planner/moe.py)."""
    num_experts: int = 0
    """Routed experts per MoE block."""
    top_k: int = 0
    """Routed experts each token runs."""
    expert_dim: int = 0
    """Hidden width of one routed expert's SwiGLU."""
    shared_experts: int = 0
    """Experts every token runs beside its routed ones."""
    active_params: int = 0
    """Parameters one token's computation multiplies (0: all of them, a dense model)."""
    qk_norm: bool = False
    """Queries and keys are RMS-normalised per head before RoPE (Qwen3)."""
    latent: LatentAttention | None = None
    """Multi-head latent attention's sizes (DeepSeek); None: plain heads
    (tools/planner/attention.py)."""

    @classmethod
    def from_args(cls, args: BaseModelArgs) -> ModelShape:
        needed = ("n_layers", "dim", "n_heads", "head_dim", "kv_heads", "ffn_hidden_dim",
                  "vocab_size")
        fields = attention_fields(args)
        missing = [n for n in needed if n not in fields and not hasattr(args, n)]
        if missing:
            raise ValueError(f"{type(args).__name__} lacks {', '.join(missing)}: the planner "
                             "needs a Llama-like decoder's shapes (see ModelShape)")
        shapes = {n: fields.get(n, int(getattr(args, n, 0))) for n in needed}
        return cls(**shapes, tie_word_embeddings=bool(getattr(args, "tie_word_embeddings", False)),
                   num_params=args.num_params(), args=args, **moe_fields(args),
                   qk_norm=bool(getattr(args, "qk_norm", False)), latent=latent_attention(args))

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.dim

    @property
    def head_params(self) -> int:
        """Final norm and output projection (none of its own when tied to the embedding)."""
        return self.dim + (0 if self.tie_word_embeddings else self.vocab_size * self.dim)

    @property
    def block_params(self) -> float:
        """Parameters of an average block (MoE models: experts averaged over all blocks)."""
        return (self.num_params - self.embedding_params - self.head_params) / self.n_layers

    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0

    @property
    def expert_block_params(self) -> float:
        """Routed-expert parameters of an average block (num_experts x 3 x dim x width per
        MoE block, spread over all blocks as ``block_params`` is)."""
        return self.moe_layers * self.num_experts * 3 * self.dim * self.expert_dim \
            / self.n_layers

    def gathered_block_params(self, tp: int, ep: int) -> float:
        """Parameters of a block FSDP gathers on one GPU: the dense ones split over TP, the
        routed experts over EP (moe.py)."""
        experts = self.expert_block_params
        return (self.block_params - experts) / tp + experts / ep

    @property
    def moe_share(self) -> float:
        """Share of the blocks that are MoE blocks."""
        return self.moe_layers / self.n_layers

    def flops_per_token(self, seq_len: int) -> int:
        if seq_len not in self._flops:
            self._flops[seq_len] = self.args.flops_per_token(seq_len)
        return self._flops[seq_len]

    @functools.cached_property
    def _flops(self) -> dict[int, int]:
        """``flops_per_token`` per sequence length, counted once (the step-time fit asks
        for it thousands of times)."""
        return {}

    def attention_flops_per_token(self, seq_len: int) -> int:
        """QK^T and AV, forward and backward, full (not causal-halved) scores: the part of
        ``flops_per_token`` that grows with the sequence (12 x layers x q_dim x seq_len for
        Llama), i.e. all but the 6 FLOPs per active weight."""
        return self.flops_per_token(seq_len) - self.flops_per_token(0)

    @property
    def params_6nd(self) -> int:
        """N of C = 6ND: every parameter of a dense model, the active ones of an MoE (its cost
        follows the weights a token multiplies: DeepSeek-V3's 6 x 37B x 14.8T)."""
        return self.active_params if self.is_moe else self.num_params

    @property
    def matmul_params(self) -> float:
        """Weights one token multiplies: the active ones (6 FLOPs each per token)."""
        return self.flops_per_token(0) / 6
