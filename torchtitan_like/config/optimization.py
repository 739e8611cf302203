"""The optimization sections of the job config: [optimizer], [muon] and [lr_scheduler].

Kept beside config/job_config.py (which holds them in ``JobConfig``) so neither file outgrows
one screen's worth of reading; the rules of job_config.py's docstring hold here too.
"""

from dataclasses import dataclass
from typing import Literal

from torchtitan_like.config.fields import DTypeName, ranged


@dataclass
class Optimizer:
    name: str = "AdamW"
    """A registered optimizer: AdamW, Adam, Muon (its keys in [muon]) or a custom_import one's."""

    lr: float = ranged(8e-4, gt=0)
    """Peak learning rate, reached at the end of warmup (under Muon: of its AdamW side)."""

    beta1: float = ranged(0.9, ge=0, lt=1)
    """Adam's first-moment decay."""

    beta2: float = ranged(0.95, ge=0, lt=1)
    """Adam's second-moment decay."""

    eps: float = ranged(1e-8, gt=0)
    """Adam's denominator epsilon."""

    weight_decay: float = ranged(0.1, ge=0)
    """Decoupled weight decay (AdamW) or L2 penalty (Adam); never on norms and biases."""

    implementation: Literal["for-loop", "foreach", "fused", "fused_opt_states_bf16"] = "foreach"
    """Kernel style of the step; fused_opt_states_bf16 = fused with state_dtype = "bfloat16"."""

    state_dtype: DTypeName = "float32"
    """Dtype exp_avg/exp_avg_sq are stored in; bfloat16 (DeepSeek-V3): the update stays fp32."""

    state_stochastic_rounding: bool = False
    """Round bfloat16 moments stochastically (unbiased) instead of to nearest; not with fused."""


@dataclass
class Muon:
    lr: float = ranged(0.0, ge=0)
    """Peak lr of the hidden matrices; 0 = [optimizer] lr (transfers under match_rms_adamw)."""

    momentum: float = ranged(0.95, ge=0, lt=1)
    """Momentum of the matrices' update (torch.optim.Muon's default)."""

    nesterov: bool = True
    """Nesterov momentum: orthogonalize g + momentum x (new momentum), not the momentum."""

    ns_steps: int = ranged(5, ge=1, lt=100)
    """Newton-Schulz iterations orthogonalizing each matrix's update (torch.optim.Muon's 5)."""

    ns_dtype: DTypeName = "bfloat16"
    """Dtype of the Newton-Schulz iteration: bfloat16 (torch.optim.Muon's) or float32."""

    weight_decay: float = ranged(0.1, ge=0)
    """Decoupled weight decay of the matrices: lr x weight_decay per step (Moonlight's 0.1)."""

    adjust_lr_fn: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    """Update scale: 0.2 sqrt(max(m, n)), AdamW's RMS (Moonlight); original: sqrt(max(1, m/n))."""


@dataclass
class LRScheduler:
    warmup_steps: int = ranged(200, ge=0)
    """Steps of linear warmup from lr/(warmup_steps+1) to lr."""

    decay_ratio: float = -1.0
    """Fraction of the post-warmup steps spent decaying (WSD); -1 = decay over all of them."""

    decay_type: Literal["linear", "sqrt", "cosine"] = "linear"
    """Shape of the decay phase."""

    min_lr_factor: float = ranged(0.0, ge=0, le=1)
    """Floor of the decay, as a fraction of lr."""
