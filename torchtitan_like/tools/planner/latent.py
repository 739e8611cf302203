"""Multi-head latent attention's sizes, as the planner reads them from a model's args
(DeepSeek-V2/V3); ``ModelShape.latent`` (inputs.py) carries them, attention.py counts what MLA
keeps for backward from them."""

from __future__ import annotations

import dataclasses
from typing import Any


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
