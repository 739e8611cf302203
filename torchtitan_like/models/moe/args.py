"""Hyper-parameters of a mixture-of-experts feed-forward layer (shared by every model family)."""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class MoEArgs:
    """One MoE layer: token-choice top-k routing over ``num_experts`` routed experts plus
    ``num_shared_experts`` always-on ones (DeepSeekMoE). Dropless: every token reaches its
    ``top_k`` experts, however uneven the load."""

    num_experts: int = 8
    """Routed experts per layer."""

    top_k: int = 2
    """Routed experts each token is sent to."""

    score_func: Literal["softmax", "sigmoid"] = "sigmoid"
    """Affinity of a token to each expert: softmax over experts (DeepSeek-V2) or an
    independent sigmoid per expert (DeepSeek-V3)."""

    route_norm: bool = True
    """Renormalise each token's top-k weights to sum to one (before ``route_scale``)."""

    route_scale: float = 1.0
    """Factor on the routed experts' weights (DeepSeek's ``routed_scaling_factor``)."""

    num_expert_groups: int = 1
    """Groups the experts are split into for group-limited routing (1 = no limit)."""

    num_limited_groups: int = 1
    """Groups a token may pick its experts from (DeepSeek-V3: at most 4 nodes per token)."""

    num_shared_experts: int = 1
    """Experts every token goes through, as one SwiGLU of that many times the expert width."""

    load_balance_coeff: float | None = 1e-3
    """Step of the auxiliary-loss-free bias update (DeepSeek-V3's gamma); None = no bias."""

    aux_loss_coeff: float = 0.0
    """Weight of the sequence-wise auxiliary balance loss (DeepSeek-V3's alpha); 0 = off."""

    use_grouped_mm: bool = True
    """Compute the routed experts with one ``torch._grouped_mm`` per weight (False = a plain
    loop over experts, the readable reference)."""

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.top_k <= self.num_experts:
            problems.append(f"top_k = {self.top_k} must be in 1..num_experts "
                            f"({self.num_experts})")
        if self.score_func not in ("softmax", "sigmoid"):
            problems.append(f"score_func = {self.score_func!r} must be 'softmax' or 'sigmoid'")
        if self.num_expert_groups < 1 or self.num_experts % self.num_expert_groups:
            problems.append(f"num_expert_groups = {self.num_expert_groups} must divide "
                            f"num_experts = {self.num_experts}")
        elif not 1 <= self.num_limited_groups <= self.num_expert_groups:
            problems.append(f"num_limited_groups = {self.num_limited_groups} must be in "
                            f"1..num_expert_groups ({self.num_expert_groups})")
        elif self.num_limited_groups * self.num_experts // self.num_expert_groups < self.top_k:
            problems.append(f"num_limited_groups = {self.num_limited_groups} groups hold fewer "
                            f"than top_k = {self.top_k} experts")
        if self.load_balance_coeff is not None and not 0 < self.load_balance_coeff < float("inf"):
            problems.append("load_balance_coeff must be a finite number > 0 (None turns the bias "
                            "off)")
        if not self.aux_loss_coeff >= 0:  # NaN too
            problems.append("aux_loss_coeff must be >= 0")
        if not 0 < self.route_scale < float("inf"):
            problems.append(f"route_scale = {self.route_scale} must be a finite number > 0")
        if self.num_shared_experts < 0:
            problems.append(f"num_shared_experts = {self.num_shared_experts} must be >= 0")
        if problems:
            raise ValueError("MoEArgs: " + "; ".join(problems))

