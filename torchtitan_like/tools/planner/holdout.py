"""Held-out validation of the planner against published runs (docs/planner-throughput.md).

Each fitted number of ``Calibration`` is fitted on the published rows ``FIT_ROWS`` names: the
value that minimises the sum of squared log ratios, predicted over published, over its rows
(tokens/s or MFU for the step-time numbers, fitted together by sweeps; the reserved peak for
the allocator's, in closed form). Leave-one-out: every row is
predicted with every number refitted on the rows that remain, so no row is judged by a number
fitted to it. A fitted number earns its place when, replaced by its null
(``calibration.NULLS``) and the others refitted the same way, the held-out table gets worse:
the rows it improves gain more (summed absolute log error) than the rows it harms lose.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

from torchtitan_like.models.registry import get_model_args, get_model_spec
from torchtitan_like.tools.planner.calibration import CALIBRATION, NULLS, Calibration, nulled
from torchtitan_like.tools.planner.communication import communication
from torchtitan_like.tools.planner.inputs import GiB, ModelShape
from torchtitan_like.tools.planner.layout_plan import Plan, plan
from torchtitan_like.tools.planner.links import Comm
from torchtitan_like.tools.planner.published import PUBLISHED_RUNS, PublishedRun
from torchtitan_like.tools.planner.rules import validate_layout
from torchtitan_like.tools.planner.step_time import estimate_step_time

_8B = ("8B, 8 GPUs, FSDP", "8B, 128 GPUs, FSDP")
FIT_ROWS: dict[str, tuple[str, ...]] = {
    "eager_passes": _8B,
    "compiled_passes": tuple(f"{name} + compile" for name in _8B),
    "ring_efficiency": tuple(run.name for run in PUBLISHED_RUNS
                             if run.layout.cp > 1 and run.layout.cp_algorithm == "ring"),
    "allocator_reserve": tuple(run.name for run in PUBLISHED_RUNS if run.memory_gib),
}
"""The rows each fitted number is fitted on: TorchTitan's eager and compiled 8B runs (bf16,
where the memory-bound kernels are the largest unknown), every run with torch's ring attention
(CP > 1), every run that publishes its memory."""

BOUNDS: dict[str, tuple[float, float]] = {
    "eager_passes": (0.0, 200.0),
    "compiled_passes": (0.0, 200.0),
    "ring_efficiency": (0.1, 2.0),
}
"""The range each step-time number is searched in (physically meaningful values)."""

STEP_TIME = tuple(name for name in FIT_ROWS if name != "allocator_reserve")
"""The step-time numbers: fitted together, by sweeps over them in turn (each changes the
others' rows: the passes are part of the CP rows' steps)."""

SWEEPS = 4
"""Sweeps of the step-time fit; the values settle to 1e-4 in two or three."""


@dataclasses.dataclass
class Row:
    """One published run with what the planner computes of it once (the shapes, the
    microbatches, the communication volumes, the plan and its live memory peak): only the
    fitted numbers change between evaluations."""

    run: PublishedRun
    model: ModelShape
    microbatches: int
    comms: list[Comm]
    plan: Plan
    """The plan with the shipped calibration."""

    @property
    def live_peak(self) -> float:
        return self.plan.memory.total

    def throughput_ratio(self, calibration: Calibration) -> float:
        """Predicted over published tokens/s per GPU (MFU where the source gives MFU)."""
        r = self.run
        step = estimate_step_time(self.model, r.cluster, r.work, r.layout, self.microbatches,
                                  self.comms, calibration).total
        per_gpu = r.work.global_batch * r.work.seq_len / step / r.cluster.num_gpus
        if r.tokens_per_second_per_gpu:
            return per_gpu / r.tokens_per_second_per_gpu
        mfu = per_gpu * self.model.flops_per_token(r.work.seq_len) \
            / (r.cluster.gpu.peak_tflops * 1e12)
        return mfu / r.mfu

    def memory_ratio(self, calibration: Calibration) -> float:
        """Predicted over published reserved peak."""
        return self.live_peak * calibration.allocator_reserve / (self.run.memory_gib * GiB)


def row(run: PublishedRun) -> Row:
    """``run`` planned once with the shipped calibration."""
    model = ModelShape.from_args(get_model_args(get_model_spec(run.model), run.flavor))
    microbatches = validate_layout(model, run.cluster, run.work, run.layout)
    return Row(run, model, microbatches,
               communication(model, run.cluster, run.work, run.layout, microbatches),
               plan(model, run.cluster, run.work, run.layout))


@functools.cache
def published_rows() -> tuple[Row, ...]:
    """Every published run, computed once."""
    return tuple(map(row, PUBLISHED_RUNS))


def _golden(loss: Callable[[float], float], lo: float, hi: float, tol: float = 1e-4) -> float:
    """The minimum of a unimodal ``loss`` on [lo, hi] (golden-section search)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss(c), loss(d)
    while b - a > tol * max(1.0, abs(b)):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = loss(d)
    return (a + b) / 2


def fit_one(name: str, rows: Sequence[Row], calibration: Calibration,
            tied: Sequence[str] = ()) -> Calibration:
    """``calibration`` with ``name`` (and the names ``tied`` to it, which take its value) set
    to the value minimising the squared log ratios of ``rows``; the allocator's reserve in
    closed form (the geometric mean of published over live)."""
    if name == "allocator_reserve":
        logs = [math.log(r.run.memory_gib * GiB / r.live_peak) for r in rows]
        return dataclasses.replace(calibration, allocator_reserve=math.exp(sum(logs) / len(logs)))

    def trial(value: float) -> Calibration:
        return dataclasses.replace(calibration, **{n: value for n in (name, *tied)})

    def loss(value: float) -> float:
        c = trial(value)
        return sum(math.log(r.throughput_ratio(c)) ** 2 for r in rows)

    return trial(_golden(loss, *BOUNDS[name]))


def fit(rows: Sequence[Row], null: str | None = None, start: Calibration = CALIBRATION
        ) -> Calibration:
    """Every fitted number on its rows among ``rows`` (``FIT_ROWS``), from ``start``. With
    ``null``, that number stays at its null (``calibration.NULLS``: a value, or tied to
    another number, which is then fitted on both numbers' rows)."""
    calibration = nulled(start, null) if null else start
    tie = NULLS[null] if null and isinstance(NULLS[null], str) else None
    names = {r.run.name for r in rows}

    def rows_of(name: str) -> list[Row]:
        wanted = set(FIT_ROWS[name]) | (set(FIT_ROWS[null]) if name == tie and null else set())
        return [r for r in rows if r.run.name in wanted and r.run.name in names]

    free = [n for n in STEP_TIME if n != null]
    for _ in range(SWEEPS):
        before = calibration
        for name in free:
            if mine := rows_of(name):
                calibration = fit_one(name, mine, calibration,
                                      (null,) if name == tie and null else ())
        if all(math.isclose(getattr(before, n), getattr(calibration, n), rel_tol=1e-4)
               for n in free):
            break
    if null != "allocator_reserve" and (mine := rows_of("allocator_reserve")):
        calibration = fit_one("allocator_reserve", mine, calibration)
    return calibration


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """One row's prediction with every fitted number refitted without it."""

    row: Row
    throughput: float
    """Held-out throughput ratio."""
    memory: float | None
    """Held-out reserved-memory ratio (None: not published)."""


def held_out(rows: Sequence[Row] | None = None, null: str | None = None) -> list[HeldOut]:
    """The leave-one-out table: each row predicted by the fit on all the others (with
    ``null``: that number at its null). Only the numbers a row is fitted to are refitted
    without it (the step-time numbers together; the allocator's alone)."""
    rows = list(rows or published_rows())
    everything = fit(rows, null)
    step_rows = {name for n in STEP_TIME for name in FIT_ROWS[n]}
    table = []
    for r in rows:
        if r.run.name in step_rows:
            calibration = fit([o for o in rows if o is not r], null, everything)
        elif r.run.name in FIT_ROWS["allocator_reserve"] and null != "allocator_reserve":
            others = [o for o in rows if o is not r and o.run.memory_gib]
            calibration = fit_one("allocator_reserve", others, everything)
        else:
            calibration = everything
        table.append(HeldOut(r, r.throughput_ratio(calibration),
                             r.memory_ratio(calibration) if r.run.memory_gib else None))
    return table


def log_errors(table: Sequence[HeldOut], name: str) -> list[float]:
    """|log ratio| of every row the fitted number ``name`` is judged on (throughput rows for
    the step-time numbers, memory rows for the allocator's)."""
    if name == "allocator_reserve":
        return [abs(math.log(h.memory)) for h in table if h.memory is not None]
    return [abs(math.log(h.throughput)) for h in table]


@dataclasses.dataclass(frozen=True)
class Justification:
    """What one fitted number does to the held-out table, against its null."""

    name: str
    improves: float
    """Summed decrease of |log error| over the rows it improves."""
    harms: float
    """Summed increase over the rows it makes worse."""

    @property
    def justified(self) -> bool:
        return self.improves > self.harms


def justify(name: str, rows: Sequence[Row] | None = None,
            table: Sequence[HeldOut] | None = None) -> Justification:
    """The held-out table with ``name`` fitted (``table``, computed when not given) against
    the table with ``name`` at its null and every other number refitted."""
    rows = list(rows or published_rows())
    with_it = log_errors(table or held_out(rows), name)
    without = log_errors(held_out(rows, name), name)
    diffs = [b - a for a, b in zip(with_it, without, strict=True)]
    return Justification(name, sum(d for d in diffs if d > 0), -sum(d for d in diffs if d < 0))


def justifications(rows: Sequence[Row] | None = None,
                   table: Sequence[HeldOut] | None = None) -> list[Justification]:
    """``justify`` for every fitted number (``table``: the held-out table of ``rows``)."""
    rows = list(rows or published_rows())
    table = table or held_out(rows)
    return [justify(name, rows, table) for name in NULLS]
