"""What the config's sections share: the dtype names and the ranged numeric field."""

from dataclasses import field
from typing import Any, Literal

DTypeName = Literal["float32", "bfloat16"]
PipelineScheduleName = Literal[
    "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
    "DualPipeV",
]


def ranged(default: Any, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None) -> Any:
    """A numeric field with the bounds its value must lie in (checked once, config/ranges.py;
    a table of numbers declares them as ``metadata={"range": ...}``). Every float must in any
    case be finite, every integer fit 64 bits."""
    bounds = {k: v for k, v in {"ge": ge, "gt": gt, "le": le, "lt": lt}.items() if v is not None}
    return field(default=default, metadata={"range": bounds})
