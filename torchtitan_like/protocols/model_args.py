"""``BaseModelArgs``: what the trainer asks of a model family's hyper-parameters.

A flavor is an instance of a subclass; ``check_arg_ranges`` is the range check every model's
``validate`` runs first.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torchtitan_like.config.errors import ConfigError

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims


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


def _field(args: Any, dotted: str) -> Any:
    """``args.a.b`` for ``"a.b"``; None where a group on the way is None (switched off)."""
    value = args
    for name in dotted.split("."):
        value = getattr(value, name) if value is not None else None
    return value


def _non_finite(args: Any, prefix: str = "") -> str | None:
    """The dotted name of the first float field that is not finite, nested groups included."""
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            return prefix + f.name
        if dataclasses.is_dataclass(value) and (inner := _non_finite(value, f"{f.name}.")):
            return prefix + inner
    return None


def check_arg_ranges(args: Any, where: str, *, positive: Iterable[str] = (),
                     non_negative: Iterable[str] = ()) -> None:
    """ConfigError naming the first hyper-parameter out of range: every float finite (nested
    groups included), the fields in ``positive`` > 0 and those in ``non_negative`` >= 0 (a
    dotted name reaches into a group, e.g. ``rope_scaling.factor``; None passes, it is the
    "off" of a field that allows it). A model's ``validate`` calls it first, so a flavor and
    ``[model] overrides`` meet the same bounds before anything divides by a head count."""
    if name := _non_finite(args):
        raise ConfigError(f"{where}: {name} = {_field(args, name)}: must be a finite number")
    for names, ok, bound in ((positive, lambda v: v > 0, "> 0"),
                             (non_negative, lambda v: v >= 0, ">= 0")):
        for name in names:
            value = _field(args, name)
            if value is not None and not ok(value):
                raise ConfigError(f"{where}: {name} = {value!r}: must be {bound}")
