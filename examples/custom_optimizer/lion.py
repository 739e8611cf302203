"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"), registered from
outside the package: name this file in ``[job] custom_import`` and set ``[optimizer] name =
"Lion"``; its keys are the ``[lion]`` section (docs/extending.md, "Your own optimizer")."""

from dataclasses import dataclass

import torch

from torchtitan_like.components.optim.registry import (
    OptimizerSpec,
    StateFootprint,
    register_optimizer,
)
from torchtitan_like.config.errors import ConfigError


@dataclass
class LionConfig:
    lr: float = 1e-4
    """Peak learning rate (3-10x below AdamW's: the update is a sign, +-1 per element)."""
    beta1: float = 0.9
    """Weight of the momentum in the update's sign."""
    beta2: float = 0.99
    """Decay of the momentum."""
    weight_decay: float = 0.1
    """Decoupled weight decay: lr x weight_decay per step (none on norms and biases)."""

    def validate(self) -> None:
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ConfigError("[lion] beta1 and beta2 must lie in [0, 1)")


class Lion(torch.optim.Optimizer):
    """w <- w (1 - lr wd) - lr sign(b1 m + (1 - b1) g);  m <- b2 m + (1 - b2) g."""

    def __init__(self, params, lr: float, betas: tuple[float, float], weight_decay: float):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in (p for p in group["params"] if p.grad is not None):
                if "exp_avg" not in self.state[p]:
                    self.state[p]["exp_avg"] = torch.zeros_like(p)
                m = self.state[p]["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m.lerp(p.grad, 1 - beta1)), alpha=-group["lr"])
                m.lerp_(p.grad, 1 - beta2)


def build(groups: list[dict], job) -> Lion:
    lion = job.lion
    return Lion(groups, lr=lion.lr, betas=(lion.beta1, lion.beta2),
                weight_decay=lion.weight_decay)


register_optimizer(OptimizerSpec(
    "Lion", build, section="lion", config_cls=LionConfig,
    footprint=lambda job: StateFootprint(matrix_states=1, other_states=1)))
