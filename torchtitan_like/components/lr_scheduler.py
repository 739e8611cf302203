"""Warmup -> stable -> decay (WSD) learning-rate schedule with a floor.

For optimizer step s (0-based), W warmup steps, S total steps and D = round(decay_ratio x
(S - W)) decay steps (all of S - W when decay_ratio = -1), the LR is lr x f(s) with

    f(s) = (s + 1) / (W + 1)                          for s < W
    f(s) = 1                                          for W <= s < S - D
    f(s) = m + (1 - m) x g(p),  p = (s - S + D) / D   for s >= S - D

where m = min_lr_factor and g is 1 - p (linear), 1 - sqrt(p) (sqrt) or (1 + cos(pi p)) / 2
(cosine). Warmup never starts at 0, so the first step already trains.
"""

from __future__ import annotations

import functools
import math

from torch.optim.lr_scheduler import LambdaLR

from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.optimization import LRScheduler as LRSchedulerConfig


def lr_factor(step: int, config: LRSchedulerConfig, total_steps: int) -> float:
    warmup = min(config.warmup_steps, total_steps)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    after_warmup = total_steps - warmup
    ratio = 1.0 if config.decay_ratio < 0 else config.decay_ratio
    decay_steps = round(ratio * after_warmup)
    decay_start = total_steps - decay_steps
    if decay_steps == 0 or step < decay_start:
        return 1.0
    progress = min((step - decay_start) / decay_steps, 1.0)
    shape = {
        "linear": 1 - progress,
        "sqrt": 1 - math.sqrt(progress),
        "cosine": 0.5 * (1 + math.cos(math.pi * progress)),
    }[config.decay_type]
    return config.min_lr_factor + (1 - config.min_lr_factor) * shape


class LRSchedulersContainer:
    """One LambdaLR per optimizer of the container, stepped together."""

    def __init__(self, optimizers: OptimizersContainer, config: LRSchedulerConfig, steps: int):
        fn = functools.partial(lr_factor, config=config, total_steps=steps)
        self.schedulers = [LambdaLR(opt, fn) for opt in optimizers.optimizers]

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    @property
    def last_lr(self) -> float:
        return self.schedulers[0].get_last_lr()[0]
