"""Model converters: swap modules of the plain model before the parallelization plan runs.

A converter changes the model built on meta (docs/design.md, "Data flow", step 6) before pipeline
splitting and the plan, so tensor parallelism, activation checkpointing, compile and FSDP all
see the converted modules. It may also act after every optimizer step (float8 recomputes its
FSDP weight scales there). Another numeric format (MX, quantization-aware training) is one more
class with these two methods, added in ``build_converters``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from torch import nn

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


def build_converters(config: JobConfig, parallel_dims: ParallelDims,
                     device_type: str) -> ModelConverters:
    converters: list[ModelConverter] = []
    if config.float8.enable:
        from torchtitan_like.components.float8 import Float8Converter

        converters.append(Float8Converter(config.float8, parallel_dims, device_type,
                                          compile_enabled=config.compile.enable))
    return ModelConverters(converters)
