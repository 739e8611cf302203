"""The planner's fitted numbers, in one place.

Every other number of the step-time and memory models is counted (FLOPs, bytes, schedule
steps) or sourced (datasheet peaks and bandwidths, measured matmul rates). These are fitted:
each to the published runs named in ``tools/planner/holdout.py: FIT_ROWS`` and judged, by
leave-one-out, on every published run (docs/planner-throughput.md, "Held-out validation").
The values here are what that fit gives on all rows (a test refits them); each says what the
model would use without it (its ``NULLS`` entry), and the held-out table shows the fit is
worth having: with the null instead, the held-out predictions get worse
(tests/unit/test_planner_published.py). A fitted number is passed as a ``Calibration``, never
read from a module global, so a fit can try values without touching the planner.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Calibration:
    eager_passes: float = 33.1
    """Times each activation element of a block (activations.layer_elements without AC)
    crosses HBM in the block's memory-bound kernels (norms, RoPE, SwiGLU's element-wise ops,
    residual adds, casts, forward and backward) when they run eagerly. It also carries what
    the model does not count (kernel launch gaps, the optimizer step, the power limit of the
    runs it is fitted to). Null: 0 (no memory-bound time)."""
    compiled_passes: float = 23.0
    """The same with compiled blocks (inductor fuses element-wise kernels). Null: the eager
    passes (compiling changes nothing)."""
    ring_efficiency: float = 0.581
    """Share of the attention kernels' rate (``GPU.attention_efficiency``) that torch's ring
    attention reaches on the steps after its first (each a received K/V chunk, half of it
    needed: ring.py), with what the ring model does not count. Null: 1 (those steps attend
    as fast as the first)."""
    allocator_reserve: float = 1.19
    """The CUDA caching allocator's reserved peak over the peak of live tensors the memory
    model counts (published runs log ``max_memory_reserved``). Null: 1 (reserved = live)."""


CALIBRATION = Calibration()
"""The values the planner ships: the fit on every published row (holdout.py)."""

NULLS: dict[str, object] = {
    "eager_passes": 0.0,
    "compiled_passes": "eager_passes",
    "ring_efficiency": 1.0,
    "allocator_reserve": 1.0,
}
"""What each fitted number is replaced by to judge it (see each field): a value, or the name of
another field it is tied to."""


def nulled(calibration: Calibration, name: str) -> Calibration:
    """``calibration`` with the fitted number ``name`` replaced by its null (``NULLS``)."""
    null = NULLS[name]
    if isinstance(null, str):
        null = getattr(calibration, null)
    return dataclasses.replace(calibration, **{name: null})
