"""The optimizer registry: how ``[optimizer] name`` finds what to build, like the model registry.

An ``OptimizerSpec`` is the whole contract between an optimizer and the platform:

- ``build(groups, job)`` returns ONE ``torch.optim.Optimizer`` over the parameter groups of one
  model part (components/optim/param_groups.py: the hidden matrices, the other weights, and the
  norms and biases, each with its options from ``group_options``). Being one torch optimizer
  is what makes the rest work unchanged: the LR schedule scales every group's own lr, DCP
  saves and reshards its states (DTensors under FSDP/TP/EP), torchft's commit gates its one
  ``step()``, post-step hooks (MoE balancing, float8) attach to it.
- ``group_options(job)``: per group kind, the options that differ from the optimizer's
  defaults (default: no weight decay on norms and biases).
- ``section`` and ``config_cls``: its own config section (``[muon]``), validated at start-up
  (a built-in section's keys set for another optimizer are named in the start-up warning of
  settings without effect, config/switches.py).
- ``footprint(job)``: the state tensors it keeps per parameter and the extra work per matrix,
  what the planner's memory and step-time models read (tools/planner/optimizer.py).
- ``validate(job, device_type)``: its own start-up checks, raising ``ConfigError``.

The built-in optimizers (AdamW, Adam, Muon) are registered by components/optimizer.py; a
research optimizer is registered from a module named in ``[job] custom_import`` with
``register_optimizer`` (docs/extending.md, "Your own optimizer").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torchtitan_like.config.custom_sections import register_config_section
from torchtitan_like.config.errors import unknown_registered
from torchtitan_like.config.job_config import JobConfig

if TYPE_CHECKING:
    import torch

MATRIX, OTHER, NO_DECAY = "matrix", "other", "no_decay"
GROUP_KINDS = (MATRIX, OTHER, NO_DECAY)
"""Parameter group kinds, in group order: the blocks' matrices (hidden layers), the other
weights (embeddings, output head), the 1-D parameters (norm gains, biases)."""


@dataclasses.dataclass(frozen=True)
class StateFootprint:
    """What the planner reads of an optimizer (tools/planner/optimizer.py)."""

    matrix_states: float = 2
    """State tensors per element of a hidden matrix (Adam: exp_avg, exp_avg_sq; Muon: 1)."""
    other_states: float = 2
    """State tensors per element of every other parameter."""
    matrix_state_bytes: int = 0
    """Bytes of a matrix state element; 0 = ``[optimizer] state_dtype``'s (Adam's moments)."""
    newton_schulz_steps: int = 0
    """Newton-Schulz iterations per matrix and step (Muon); 0 = none."""
    newton_schulz_bytes: int = 2
    """Bytes per element the iteration runs in and the matrices travel in."""


GroupOptions = Mapping[str, Mapping[str, Any]]
"""Group kind -> options of that group (lr, weight_decay, ...) beside the optimizer's defaults."""


def no_decay_on_norms_and_biases(job: JobConfig) -> GroupOptions:
    """The default grouping: the optimizer's own options everywhere, no weight decay on norm
    gains and biases (GPT-3's and Llama's practice)."""
    return {MATRIX: {}, OTHER: {}, NO_DECAY: {"weight_decay": 0.0}}


def adam_footprint(job: JobConfig) -> StateFootprint:
    return StateFootprint()


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    name: str
    """Registry key, the value of ``[optimizer] name``."""

    build: Callable[[list[dict[str, Any]], JobConfig], torch.optim.Optimizer]
    """(parameter groups of one model part, job) -> one torch optimizer over them."""

    group_options: Callable[[JobConfig], GroupOptions] = no_decay_on_norms_and_biases
    """Per group kind, the options that differ from the optimizer's defaults."""

    section: str | None = None
    """Its own config section (``[muon]``), or None when ``[optimizer]`` has all it reads."""

    config_cls: type | None = None
    """The section's dataclass: fields with a type, a default and a docstring (a section that
    is not built in is registered as a custom section, config/custom_sections.py)."""

    footprint: Callable[[JobConfig], StateFootprint] = adam_footprint
    """Its states and extra work, for the planner."""

    validate: Callable[[JobConfig, str], None] | None = None
    """(job, device type) -> None, or ConfigError for a job it cannot run."""


_REGISTRY: dict[str, OptimizerSpec] = {}


def register_optimizer(spec: OptimizerSpec) -> None:
    """Make ``spec`` selectable as ``[optimizer] name = spec.name`` (and its section, when it
    has one that is not built in, parsable as ``[spec.section]``)."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"an optimizer named {spec.name!r} is already registered")
    if (spec.section is None) != (spec.config_cls is None):
        raise ValueError(f"optimizer {spec.name!r}: give both section and config_cls, or neither")
    built_in = {f.name for f in dataclasses.fields(JobConfig)}
    if spec.section is not None and spec.section not in built_in:
        register_config_section(spec.section, spec.config_cls)
    _REGISTRY[spec.name] = spec


def registered_optimizers() -> list[OptimizerSpec]:
    """Every registered optimizer, in registration order (the built-in ones first)."""
    return list(_REGISTRY.values())


def get_optimizer_spec(name: str) -> OptimizerSpec:
    if name not in _REGISTRY:
        raise unknown_registered("[optimizer] name", "optimizer", name, list(_REGISTRY))
    return _REGISTRY[name]


def validate_optimizer(job: JobConfig, device_type: str) -> OptimizerSpec:
    """The job's optimizer, its own checks run; ConfigError for an unknown name."""
    spec = get_optimizer_spec(job.optimizer.name)
    if spec.validate is not None:
        spec.validate(job, device_type)
    return spec
