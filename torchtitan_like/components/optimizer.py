"""One optimizer per model part (a pipeline rank may hold several stages), stepped together.

``[optimizer] state_dtype = "bfloat16"`` keeps Adam's moments in bf16 (components/bf16_moments.py):
torch's fused AdamW on CUDA (``implementation = "fused"``, or TorchTitan's
``"fused_opt_states_bf16"``, which implies the dtype), our chunked foreach step otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from torchtitan_like.components import bf16_moments
from torchtitan_like.config.derived import optimizer_state_dtype
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Optimizer as OptimizerConfig

FUSED = ("fused", "fused_opt_states_bf16")


def validate(config: OptimizerConfig, param_dtype: str, device_type: str) -> None:
    """Refuse what no implementation runs (the moments' dtype as derived: TorchTitan's
    ``fused_opt_states_bf16`` is fused + bf16 moments, config/derived.py)."""
    state_dtype = optimizer_state_dtype(config)
    if config.state_stochastic_rounding and state_dtype != "bfloat16":
        raise ConfigError('[optimizer] state_stochastic_rounding rounds bfloat16 moments: set '
                          'state_dtype = "bfloat16" as well, or turn it off')
    if state_dtype != "bfloat16":
        return
    if param_dtype != "float32":
        raise ConfigError(f'[optimizer] state_dtype = "bfloat16" keeps the moments of fp32 '
                          f'parameters in bf16, but [training] dtype = "{param_dtype}" (whose '
                          'moments are already bf16): set [training] dtype = "float32"')
    if config.implementation in FUSED and device_type != "cuda":
        raise ConfigError(f'[optimizer] implementation = "{config.implementation}" with bf16 '
                          f"moments is torch's fused CUDA AdamW; this job runs on {device_type}: "
                          'use implementation = "foreach"')
    if config.implementation in FUSED and config.state_stochastic_rounding:
        raise ConfigError("[optimizer] state_stochastic_rounding: torch's fused AdamW rounds its "
                          'bf16 moments to nearest; use implementation = "foreach"')


def build_optimizer(params: list[nn.Parameter], config: OptimizerConfig) -> torch.optim.Optimizer:
    """The configured Adam/AdamW over ``params`` (a validated config)."""
    common = {"lr": config.lr, "betas": (config.beta1, config.beta2), "eps": config.eps,
              "weight_decay": config.weight_decay}
    fused, bf16_states = config.implementation in FUSED, optimizer_state_dtype(config) == "bfloat16"
    if bf16_states and not fused:
        return bf16_moments.Bf16MomentsAdam(
            params, **common, decoupled_weight_decay=config.name == "AdamW",
            foreach=config.implementation == "foreach",
            stochastic_rounding=config.state_stochastic_rounding)
    cls = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam}[config.name]
    optimizer = cls(params, **common, foreach=config.implementation == "foreach", fused=fused)
    if bf16_states:
        bf16_moments.fused_with_bf16_moments(optimizer)
    return optimizer


UpdateGate = Callable[[], bool]
"""Asked before the optimizer step: False withholds the step's update (the step still counts,
e.g. a spike under ``[spike] policy = "skip"``); an exception abandons the step (a replica
group that failed in it: distributed/fault_tolerance.py ``StepDropped``)."""


class OptimizersContainer:
    """Behaves like one optimizer over all model parts; keeps one per part so that each part's
    state dict maps onto its own parameters (what distributed checkpoints need). ``gates``
    decide, in order, whether a step updates the weights (the trainer adds the replica groups'
    commit, then the spike policy)."""

    def __init__(self, model_parts: list[nn.Module], config: OptimizerConfig):
        self.model_parts = model_parts
        self.optimizers = [build_optimizer(list(part.parameters()), config)
                           for part in model_parts]
        self.gates: list[UpdateGate] = []

    def step(self) -> bool:
        """Step every part's optimizer unless a gate withholds the update; True when stepped."""
        if not all(gate() for gate in self.gates):
            return False
        for optimizer in self.optimizers:
            optimizer.step()
        return True

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
