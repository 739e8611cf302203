"""Token-choice top-k routing, with DeepSeek's group-limited selection and selection bias."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchtitan_like.models.moe.args import MoEArgs


def limit_to_groups(scores: torch.Tensor, num_groups: int, num_limited: int,
                    score_func: str) -> torch.Tensor:
    """Set to -inf the scores of every expert outside each token's best ``num_limited`` of
    ``num_groups`` contiguous expert groups (DeepSeek-V3's node-limited routing).

    A group's score is the sum of its two highest expert scores for sigmoid gating
    (DeepSeek-V3) and its highest score for softmax gating (DeepSeek-V2)."""
    tokens, experts = scores.shape
    grouped = scores.view(tokens, num_groups, experts // num_groups)
    if score_func == "sigmoid":
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
    else:
        group_scores = grouped.amax(dim=-1)
    best = group_scores.topk(num_limited, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(tokens, experts)


class TokenChoiceTopKRouter(nn.Module):
    """x (tokens, dim) -> each token's top-k experts and their weights.

    Gating runs in fp32 whatever the compute dtype: the scores decide discrete choices and
    small rounding differences would flip them. The optional ``expert_bias`` is added for the
    choice only; the weights that scale the experts' outputs are the unbiased scores."""

    def __init__(self, dim: int, args: MoEArgs):
        super().__init__()
        self.args = args
        self.gate = nn.Linear(dim, args.num_experts, bias=False)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """(tokens, num_experts) fp32 affinities."""
        logits = F.linear(x.float(), self.gate.weight.float())
        if self.args.score_func == "sigmoid":
            return torch.sigmoid(logits)
        return torch.softmax(logits, dim=-1)

    def forward(self, x: torch.Tensor, expert_bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (top_weights (tokens, k) fp32, selected experts (tokens, k), scores
        (tokens, num_experts) fp32)."""
        a = self.args
        scores = self.scores(x)
        choice = scores if expert_bias is None else scores + expert_bias.float()
        if a.num_limited_groups < a.num_expert_groups:
            choice = limit_to_groups(choice, a.num_expert_groups, a.num_limited_groups,
                                     a.score_func)
        selected = choice.topk(a.top_k, dim=-1).indices
        weights = scores.gather(1, selected)
        if a.route_norm:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * a.route_scale, selected, scores

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.gate.weight, mean=0.0, std=init_std)
