"""One optimizer per model part (a pipeline rank may hold several stages), stepped together."""

from __future__ import annotations

import torch
from torch import nn

from torchtitan_like.config.job_config import Optimizer as OptimizerConfig


class OptimizersContainer:
    """Behaves like one optimizer over all model parts; keeps one per part so that each part's
    state dict maps onto its own parameters (what distributed checkpoints need)."""

    def __init__(self, model_parts: list[nn.Module], config: OptimizerConfig):
        cls = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam}[config.name]
        kwargs = {
            "lr": config.lr,
            "betas": (config.beta1, config.beta2),
            "eps": config.eps,
            "weight_decay": config.weight_decay,
            "foreach": config.implementation == "foreach",
            "fused": config.implementation == "fused",
        }
        self.model_parts = model_parts
        self.optimizers = [cls(part.parameters(), **kwargs) for part in model_parts]

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
