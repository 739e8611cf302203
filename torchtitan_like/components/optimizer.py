"""One optimizer per model part (a pipeline rank may hold several stages), stepped together.

``[optimizer] name`` is looked up in the optimizer registry (components/optim/registry.py);
AdamW, Adam and Muon (components/optim/muon.py) are registered here, a research optimizer by
a ``[job] custom_import`` module. Each part's parameters are grouped by rule
(components/optim/param_groups.py) and the registered builder makes one torch optimizer of them.

``[optimizer] state_dtype = "bfloat16"`` keeps Adam's moments in bf16 (components/bf16_moments.py,
which builds every implementation of it: ``"fused"`` or TorchTitan's ``"fused_opt_states_bf16"``,
which implies the dtype, runs torch's fused AdamW where its kernel takes bf16 states and a
compiled fused step elsewhere; foreach and for-loop run a chunked step).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from torchtitan_like.components import bf16_moments
from torchtitan_like.components.optim.muon import muon_spec
from torchtitan_like.components.optim.param_groups import param_groups
from torchtitan_like.components.optim.registry import (
    OptimizerSpec,
    get_optimizer_spec,
    register_optimizer,
)
from torchtitan_like.config.derived import optimizer_state_dtype
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.optimization import Optimizer as OptimizerConfig

FUSED = ("fused", "fused_opt_states_bf16")


def validate(config: OptimizerConfig, param_dtype: str, device_type: str) -> None:
    """Refuse what no implementation runs (the moments' dtype as derived: TorchTitan's
    ``fused_opt_states_bf16`` is fused + bf16 moments, config/derived.py)."""
    if optimizer_state_dtype(config) != "bfloat16":
        return
    if param_dtype != "float32":
        raise ConfigError(f'[optimizer] state_dtype = "bfloat16" keeps the moments of fp32 '
                          f'parameters in bf16, but [training] dtype = "{param_dtype}" (whose '
                          'moments are already bf16): set [training] dtype = "float32"')
    if config.implementation in FUSED and (why := bf16_moments.check_fused(device_type)):
        raise ConfigError(f'[optimizer] implementation = "{config.implementation}" with bf16 '
                          f'moments: {why}; use implementation = "foreach"')
    if config.implementation in FUSED and config.state_stochastic_rounding:
        raise ConfigError("[optimizer] state_stochastic_rounding: the fused bf16-moment steps "
                          'round to nearest; use implementation = "foreach"')


def build_optimizer(params: list[nn.Parameter] | list[dict], config: OptimizerConfig
                    ) -> torch.optim.Optimizer:
    """The configured Adam/AdamW over ``params`` (parameters or groups; a validated config)."""
    common = {"lr": config.lr, "betas": (config.beta1, config.beta2), "eps": config.eps,
              "weight_decay": config.weight_decay}
    if optimizer_state_dtype(config) == "bfloat16":
        return bf16_moments.build_bf16_moments_adam(params, common, config.name,
                                                    config.implementation,
                                                    config.state_stochastic_rounding)
    cls = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam}[config.name]
    return cls(params, **common, foreach=config.implementation == "foreach",
               fused=config.implementation in FUSED)


def _build_adam(groups: list[dict], job: JobConfig) -> torch.optim.Optimizer:
    return build_optimizer(groups, job.optimizer)


register_optimizer(OptimizerSpec("AdamW", _build_adam))
register_optimizer(OptimizerSpec("Adam", _build_adam))
register_optimizer(muon_spec(build_optimizer))


def optimizer_spec(job: JobConfig) -> OptimizerSpec:
    """The registered optimizer ``[optimizer] name`` names (the built-in ones registered)."""
    return get_optimizer_spec(job.optimizer.name)


UpdateGate = Callable[[], bool]
"""Asked before the optimizer step: False withholds the step's update (the step still counts,
e.g. a spike under ``[spike] policy = "skip"``); an exception abandons the step (a replica
group that failed in it: distributed/fault_tolerance.py ``StepDropped``)."""


class OptimizersContainer:
    """Behaves like one optimizer over all model parts; keeps one per part so that each part's
    state dict maps onto its own parameters (what distributed checkpoints need). ``gates``
    decide, in order, whether a step updates the weights (the trainer adds the replica groups'
    commit, then the spike policy)."""

    def __init__(self, model_parts: list[nn.Module], config: JobConfig):
        self.model_parts = model_parts
        spec = optimizer_spec(config)
        options = spec.group_options(config)
        self.optimizers = [spec.build(param_groups(part, options), config)
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
