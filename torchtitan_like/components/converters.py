"""Model converters: swap modules of the plain model before the parallelization plan runs.

A converter changes the model built on meta (docs/design.md, "Data flow", step 6) before pipeline
splitting and the plan, so tensor parallelism, activation checkpointing, compile and FSDP all
see the converted modules. It may also act after every optimizer step (float8 recomputes its
FSDP weight scales there).

Converters are chosen by name, ``[model] converters = ["float8", ...]``, applied in that order.
Each name is registered with ``register_converter(name, build)``; a ``[job] custom_import``
module registers its own the same way (another numeric format, quantization-aware training).
Float8 is registered as "float8" and keeps its settings in ``[float8]``; its historical switch
``[float8] enable = true`` means the same as listing "float8" (applied last when not listed),
so both spellings give one job. "moe_grouped_mm" (the routed experts' low-precision grouped
GEMMs, components/moe_low_precision.py) likewise follows ``[float8] moe_grouped_mm``. The
config keeps what the user wrote: the list applied is derived (config/derived.py,
``model_converters``; ``float8_enabled`` for either spelling).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from torch import nn

from torchtitan_like.config.derived import model_converters
from torchtitan_like.config.errors import ConfigError, unknown_registered

if TYPE_CHECKING:
    from torchtitan_like.components.optimizer import OptimizersContainer
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims


class ModelConverter(Protocol):
    def convert(self, model: nn.Module) -> None:
        """Swap modules of ``model`` in place (it is on meta, before any parallelism)."""

    def post_optimizer_step(self, model: nn.Module) -> None:
        """Runs after each optimizer step of the optimizer of ``model`` (one model part)."""


class ModelConverters:
    """The job's converters, applied in order."""

    def __init__(self, converters: list[ModelConverter]):
        self.converters = converters

    def convert(self, model: nn.Module) -> None:
        for converter in self.converters:
            converter.convert(model)

    def register_optimizer_hooks(self, optimizers: OptimizersContainer,
                                 model_parts: list[nn.Module]) -> None:
        """Call ``post_optimizer_step`` on each part right after its optimizer steps."""
        for optimizer, part in zip(optimizers.optimizers, model_parts, strict=True):
            for converter in self.converters:
                optimizer.register_step_post_hook(
                    lambda _opt, _args, _kwargs, c=converter, m=part: c.post_optimizer_step(m)
                )


ConverterBuilder = Callable[["JobConfig", "ParallelDims", str], ModelConverter]
"""(job config, parallel dims, device type) -> a converter for this job."""

_REGISTRY: dict[str, ConverterBuilder] = {}


def register_converter(name: str, build: ConverterBuilder) -> None:
    """Make ``build`` selectable as ``[model] converters = [name]``."""
    if name in _REGISTRY and _REGISTRY[name] is not build:
        raise ValueError(f"a converter named {name!r} is already registered")
    _REGISTRY[name] = build


def check_converters(config: JobConfig) -> None:
    """ConfigError unless every name of ``[model] converters`` is registered, once, and
    "moe_grouped_mm" is listed only with its recipe (``[float8] moe_grouped_mm``)."""
    listed = config.model.converters
    for name in listed:
        if name not in _REGISTRY:
            raise unknown_registered("[model] converters", "converter", name, sorted(_REGISTRY),
                                     ", with components/converters.py's register_converter")
    if len(set(listed)) != len(listed):
        raise ConfigError(f"[model] converters lists a converter twice: {listed}")
    if "moe_grouped_mm" in listed and config.float8.moe_grouped_mm == "none":
        raise ConfigError('[model] converters lists "moe_grouped_mm": choose its recipe with '
                          '[float8] moe_grouped_mm = "mxfp8" or "float8_rowwise"')


def _build_float8(config: JobConfig, parallel_dims: ParallelDims,
                  device_type: str) -> ModelConverter:
    from torchtitan_like.components.float8 import Float8Converter

    return Float8Converter(config.float8, parallel_dims, device_type,
                           compile_enabled=config.compile.enable)


register_converter("float8", _build_float8)


def _build_moe_grouped_mm(config: JobConfig, _parallel_dims: ParallelDims,
                          _device_type: str) -> ModelConverter:
    from torchtitan_like.components.moe_low_precision import MoEGroupedMMConverter

    return MoEGroupedMMConverter(config.float8)


register_converter("moe_grouped_mm", _build_moe_grouped_mm)


def build_converters(config: JobConfig, parallel_dims: ParallelDims,
                     device_type: str) -> ModelConverters:
    """The converters of a validated config (``check_converters`` passed), in order."""
    return ModelConverters([_REGISTRY[name](config, parallel_dims, device_type)
                            for name in model_converters(config)])
