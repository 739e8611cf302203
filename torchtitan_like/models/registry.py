"""The model registry: how the trainer finds a model, its sizes and its parallelization plan.

A ``ModelSpec`` bundles everything model-specific the trainer needs; nothing else in the
trainer knows a model by name. Research models register themselves from outside the package:
name a module in ``[job] custom_import`` that calls ``register_model`` (README, "Your own model").
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import did_you_mean

if TYPE_CHECKING:
    from torchtitan_like.components.optimizer import OptimizersContainer
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims


@dataclasses.dataclass
class BaseModelArgs(abc.ABC):
    """Hyper-parameters of one model family; a flavor is an instance of its subclass."""

    @abc.abstractmethod
    def update_from_config(self, job_config: JobConfig) -> None:
        """Adopt what the job decides, e.g. the RoPE table length from training.seq_len."""

    @abc.abstractmethod
    def num_params(self) -> int:
        """Parameter count (tied weights counted once)."""

    @abc.abstractmethod
    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs (forward + backward) per token."""

    def num_routed_experts(self) -> int:
        """Routed experts per MoE layer, which expert parallelism splits; 0 = a dense model."""
        return 0

    def validate(self, job_config: JobConfig, parallel_dims: ParallelDims) -> None:  # noqa: B027
        """Raise ConfigError if this model cannot run the job's layout; default: anything goes."""


class HFAdapter(Protocol):
    """Maps one model shape to and from HuggingFace (models/llama3/hf_adapter.py is one)."""

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Our parameter FQNs -> HF names; the values are passed through."""

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        """HF names -> our FQNs."""

    def hf_config(self, dtype: torch.dtype) -> dict[str, Any]:
        """The config.json describing this shape, weights stored in ``dtype``."""

    def check_config(self, hf_config: dict[str, Any]) -> None:
        """Raise ValueError naming what differs if ``hf_config`` is not this shape."""


ParallelizeFn = Callable[["nn.Module", "ParallelDims", "Meshes", "JobConfig"], "nn.Module"]
OptimizerHooksFn = Callable[
    [list["nn.Module"], "OptimizersContainer", "ParallelDims", "Meshes"], None]
"""(model parts, their optimizers, dims, meshes) -> registers per-step state updates as
optimizer step post-hooks (e.g. MoE bias balancing, models/moe/balancing.py)."""
PipeliningFn = Callable[["nn.Module", list[int], "JobConfig"], list["nn.Module"]]
"""(model on meta, this rank's stage indices, job) -> one module per stage, each the model with
the other stages' modules removed and parameter names unchanged (distributed/pipeline.py)."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    """Registry key, the value of [model] name."""

    model_cls: Callable[[Any], nn.Module]
    """Builds the plain model from an args instance; must offer ``init_weights()``."""

    flavors: Mapping[str, BaseModelArgs]
    """Size presets, the values of [model] flavor."""

    parallelize_fn: ParallelizeFn
    """Applies TP/CP/AC/compile/FSDP to one model part, in the documented order."""

    pipelining_fn: PipeliningFn | None = None
    """Splits the model into pipeline stages; None = this model cannot be pipelined."""

    hf_adapter: Callable[[Any], HFAdapter] | None = None
    """Builds the HuggingFace converter for a flavor's args; None = no HF interop."""

    register_optimizer_hooks: OptimizerHooksFn | None = None
    """Called once the optimizers exist, to hook model state updated after each optimizer
    step; None = nothing to hook."""

    context_parallel_buffers: Callable[[nn.Module], list[tuple[torch.Tensor, int]]] | None = None
    """A model part's buffers laid out along the sequence, as (buffer, its sequence dim), that
    context parallelism shards beside the tokens (e.g. the RoPE table); None = this model
    cannot run under context parallelism (its attention is not causal SDPA, or its positions
    are not such a buffer)."""


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> None:
    """Make ``spec`` trainable as ``[model] name = spec.name``."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"a model named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered under ``name``. The built-in models are registered by the time this
    runs: importing this module first runs ``torchtitan_like/models/__init__.py``, which
    imports them."""
    if name not in _REGISTRY:
        raise ConfigError(
            f"[model] name: unknown model {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
            + did_you_mean(name, _REGISTRY)
            + " (a model of your own is registered by a module named in [job] custom_import)"
        )
    return _REGISTRY[name]


def get_model_args(spec: ModelSpec, flavor: str) -> BaseModelArgs:
    """A fresh copy of the flavor's args, safe to update for this job."""
    if flavor not in spec.flavors:
        raise ConfigError(
            f"[model] flavor: {spec.name} has no flavor {flavor!r}; "
            f"choose from {', '.join(spec.flavors)}" + did_you_mean(flavor, spec.flavors)
        )
    return dataclasses.replace(spec.flavors[flavor])


def model_spec_and_args(job_config: JobConfig) -> tuple[ModelSpec, BaseModelArgs]:
    """The job's model spec and its flavor's args, updated for the job."""
    spec = get_model_spec(job_config.model.name)
    args = get_model_args(spec, job_config.model.flavor)
    args.update_from_config(job_config)
    return spec, args
