"""Mixture-of-experts building blocks shared by every model family (no parallelism inside)."""

from torchtitan_like.models.moe.args import MoEArgs
from torchtitan_like.models.moe.balancing import (
    balance_experts,
    bias_update,
    register_moe_balancing,
)
from torchtitan_like.models.moe.experts import GroupedExperts
from torchtitan_like.models.moe.moe import (
    MoE,
    load_imbalance,
    routed_experts,
    sequence_balance_loss,
)
from torchtitan_like.models.moe.router import TokenChoiceTopKRouter, limit_to_groups

__all__ = [
    "GroupedExperts",
    "MoE",
    "MoEArgs",
    "TokenChoiceTopKRouter",
    "balance_experts",
    "bias_update",
    "limit_to_groups",
    "load_imbalance",
    "register_moe_balancing",
    "routed_experts",
    "sequence_balance_loss",
]
