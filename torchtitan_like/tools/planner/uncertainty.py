"""How far to trust one plan: the expected error band, from the held-out table of published
runs, and the step-time term least certain for the layout asked.

The band is the range of held-out ratios (predicted over published, every fitted number
refitted without the row: holdout.py) over the published runs that use every parallel
dimension the layout uses (TP, CP, PP, EP); with fewer than two such runs, over all of them.
A term's error is the largest held-out error among the runs where that term is at least
``WITNESS_SHARE`` of the step; a term no run witnesses is "not validated". The least certain
term is the one whose share of this layout's step times its error is the largest, a term
beyond the published range (a longer sequence, a larger CP or PP degree than any run's)
counting as not validated. The held-out figures come from ``heldout_record.py``, which
``scripts/plan_published.py --record`` writes and a test keeps current: computing them takes
seconds, too long for every ttl-plan call.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from torchtitan_like.tools.planner.heldout_record import HELD_OUT
from torchtitan_like.tools.planner.published import PUBLISHED_RUNS, PublishedRun
from torchtitan_like.tools.planner.step_time import ASYNC_TP

if TYPE_CHECKING:
    from torchtitan_like.tools.planner.inputs import Layout
    from torchtitan_like.tools.planner.layout_plan import Plan

WITNESS_SHARE = 0.10
"""A run witnesses a step-time term when the term is at least this share of its step."""

UNVALIDATED = 1.0
"""The error counted for a term no published run witnesses (100%)."""

DIMS = ("tp", "cp", "pp", "ep")

TERMS = {
    "gemm": "weight matmuls at the GPU's measured matmul rate",
    "attention": "attention kernels (FlashAttention-2's published share of the peak)",
    "memory_bound": "element-wise kernels (passes fitted on TorchTitan's 8B runs)",
    "recompute": "activation recomputation",
    "tp": "TP collectives (async TP not credited)",
    "cp": "CP attention's exposed traffic and merges",
    "cp ring": ("ring attention under CP (its later steps' efficiency fitted on TorchTitan's "
                "CP runs), its exposed K/V traffic and merges"),
    "cp gathered_kv": "Llama 3's gathered-K/V attention under CP and its exposed gathers",
    "fsdp": "exposed FSDP collectives",
    "pp": "pipeline transfers",
    "bubble": "pipeline bubble",
    "ep": "MoE all-to-all",
    "grad_accumulation": "pipelined FSDP's gradient accumulation",
    "optimizer": ("gradient clipping and the optimizer step at HBM bandwidth, Muon's "
                  "Newton-Schulz iterations and owner gathers (not fitted)"),
    "host": "the host's dispatch beyond the device's time (measured per-op costs)",
}


def _dims(layout: Layout) -> set[str]:
    return {d for d in DIMS if getattr(layout, d) > 1}


@dataclasses.dataclass(frozen=True)
class Band:
    """Held-out ratios, predicted over published, of the runs like the layout."""

    low: float
    high: float
    runs: int
    basis: str
    """Which runs: "using pp and tp", "" (all), or why all."""

    def actual(self, predicted: float) -> tuple[float, float]:
        """The range the published figure would lie in, had the planner erred as on those
        runs: predicted / high .. predicted / low."""
        return predicted / self.high, predicted / self.low


def expected_band(layout: Layout) -> Band:
    """The band of the published runs using every parallel dimension ``layout`` uses."""
    wanted = _dims(layout)
    like = [r for r in PUBLISHED_RUNS if wanted <= _dims(r.layout)]
    used = " and ".join(sorted(wanted))
    basis = f"using {used}" if wanted else ""
    if len(like) < 2:
        like, basis = list(PUBLISHED_RUNS), f"(all: fewer than 2 use {used})"
    ratios = [HELD_OUT[r.name][0] for r in like]
    return Band(min(ratios), max(ratios), len(like), basis)


def memory_band() -> Band:
    """The held-out reserved-memory ratios of every published run with memory."""
    ratios = [memory for _, memory, _ in HELD_OUT.values() if memory is not None]
    return Band(min(ratios), max(ratios), len(ratios), "")


@dataclasses.dataclass(frozen=True)
class Term:
    """The step-time term least certain for a plan."""

    name: str
    seconds: float
    share: float
    error: float
    """The largest |held-out ratio - 1| of its witnesses, or UNVALIDATED."""
    why: str


def _range_notes(plan: Plan) -> dict[str, str]:
    """Terms whose driving input lies beyond every published run, and why."""
    lay, notes = plan.layout, {}
    runs = [r for r in PUBLISHED_RUNS if r.layout.cp > 1
            and r.layout.cp_algorithm == lay.cp_algorithm]
    if lay.cp > 1:
        top_cp = max((r.layout.cp for r in runs), default=1)
        top_seq = max((r.work.seq_len for r in runs), default=0)
        if lay.cp > top_cp or plan.seq_len > top_seq:
            notes["cp"] = (f"beyond the published {lay.cp_algorithm} runs (up to CP {top_cp}, "
                           f"seq {top_seq:,})")
    top = max(r.work.seq_len for r in PUBLISHED_RUNS)
    if plan.seq_len > top:
        notes["attention"] = f"beyond the published runs' sequences (up to {top:,})"
    if lay.pp > max(r.layout.pp for r in PUBLISHED_RUNS):
        notes["bubble"] = "a deeper pipeline than any published run's"
    return notes


def _ratios(witnesses: list[PublishedRun]) -> list[float]:
    return [HELD_OUT[w.name][0] for w in witnesses]


def _parts(shares: dict[str, float], layout: Layout) -> dict[str, float]:
    """Step-time parts (or shares), attention and cp joined into one CP term under CP."""
    parts = dict(shares)
    if layout.cp > 1:
        name = f"cp {layout.cp_algorithm}"
        parts[name] = parts.pop("attention", 0.0) + parts.pop("cp", 0.0)
    return parts


def _witnesses(name: str) -> list[PublishedRun]:
    """The published runs where the term ``name`` is at least WITNESS_SHARE of the step."""
    return [r for r in PUBLISHED_RUNS
            if _parts(HELD_OUT[r.name][2], r.layout).get(name, 0.0) >= WITNESS_SHARE]


def least_certain(plan: Plan) -> Term:
    """The term of ``plan``'s step with the largest share x held-out error."""
    parts, total = _parts(plan.step.parts(), plan.layout), plan.step_seconds
    notes = _range_notes(plan)
    best: Term | None = None
    for name, seconds in parts.items():
        if seconds <= 0:
            continue
        ratios = _ratios(_witnesses(name))
        note = notes.get(name.split()[0])
        error = UNVALIDATED if note or not ratios else max(abs(r - 1) for r in ratios)
        if note:
            why = f"not validated: {note}"
        elif ratios:
            why = (f"held out on the {len(ratios)} published run(s) where it is at least "
                   f"{WITNESS_SHARE:.0%} of the step: predicted / published "
                   f"{min(ratios):.2f}-{max(ratios):.2f}")
        else:
            why = f"not validated: no published run where it is {WITNESS_SHARE:.0%} of the step"
        term = Term(name, seconds, seconds / total, error, f"{TERMS[name]}; {why}")
        if best is None or term.share * term.error > best.share * best.error:
            best = term
    assert best is not None
    return best


def with_uncertainty(result: Plan) -> dict[str, Any]:
    """The plan's JSON with its expected error band and least certain term."""
    band, term = expected_band(result.layout), least_certain(result)
    low, high = band.actual(result.tokens_per_second_per_gpu)
    return {**result.to_dict(),
            "expected_error": {"held_out_ratio_low": band.low, "held_out_ratio_high": band.high,
                               "published_runs": band.runs, "basis": band.basis,
                               "tokens_per_second_per_gpu": [low, high]},
            "least_certain_term": {"name": term.name, "seconds": term.seconds,
                                   "share": term.share, "error": term.error, "why": term.why}}


def uncertainty_lines(result: Plan) -> list[str]:
    """ttl-plan's lines on how far to trust ``result``: the band and the least certain term."""
    band, term = expected_band(result.layout), least_certain(result)
    low, high = band.actual(result.tokens_per_second_per_gpu)
    mfu_low, mfu_high = band.actual(result.mfu_estimate)
    return [
        f"Expected error: {low:,.0f}-{high:,.0f} tokens/s per GPU, MFU {mfu_low:.1%}-"
        f"{mfu_high:.1%}: the planner's held-out predictions of {band.runs} published runs"
        f"{' ' + band.basis if band.basis else ''} were {band.low - 1:+.0%} to "
        f"{band.high - 1:+.0%} of the published figures (docs/planner-throughput.md)",
        f"Least certain term: {term.name} ({term.seconds:.3f} s, {term.share:.0%} of the "
        f"step): {term.why}",
        *([f"Note: {ASYNC_TP}"] if result.layout.async_tp else []),
    ]
