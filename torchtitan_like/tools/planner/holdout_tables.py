"""The tables of docs/planner-throughput.md that ``scripts/plan_published.py`` prints: the
planner beside every published run, held out and in sample; the fitted numbers and what each
does to the held-out table; every row's source, inputs and assumptions."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from torchtitan_like.tools.planner.calibration import CALIBRATION, NULLS
from torchtitan_like.tools.planner.holdout import (
    FIT_ROWS,
    HeldOut,
    Justification,
    held_out,
    justifications,
)
from torchtitan_like.tools.planner.inputs import GiB

LIMIT = 0.25
"""The tests hold every held-out prediction within this share of its published figure."""

MEMORY_LIMIT = 0.15
"""... and every held-out reserved-memory prediction within this share."""


def _fits(name: str) -> str:
    return ", ".join(n for n, rows in FIT_ROWS.items() if name in rows) or "-"


def _edge(ratio: float, limit: float = LIMIT) -> str:
    """Flags a row within 5 points of its limit: held, but one small change from a miss."""
    return " (at the edge)" if abs(ratio - 1) > limit - 0.05 else ""


def throughput_table(table: Sequence[HeldOut]) -> str:
    """Published beside predicted tokens/s (or MFU), held out and in sample."""
    lines = ["| Run | Published | Predicted, held out | Held-out ratio | In-sample ratio | "
             "Fitted numbers it helps fit |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for h in table:
        r = h.row.run
        in_sample = h.row.throughput_ratio(CALIBRATION)
        if r.tokens_per_second_per_gpu:
            published = f"{r.tokens_per_second_per_gpu:,.0f} tok/s"
            predicted = f"{r.tokens_per_second_per_gpu * h.throughput:,.0f} tok/s"
        else:
            published, predicted = f"{r.mfu:.0%} MFU", f"{r.mfu * h.throughput:.1%} MFU"
        lines.append(f"| {r.name} | {published} | {predicted} | {h.throughput:.2f}"
                     f"{_edge(h.throughput)} | {in_sample:.2f} | {_fits(r.name)} |")
    return "\n".join(lines)


def memory_table(table: Sequence[HeldOut]) -> str:
    """Published beside predicted reserved memory, held out, with the live peak."""
    lines = ["| Run | Published reserved GiB | Predicted reserved, held out | Held-out ratio | "
             "Live peak GiB |", "| --- | ---: | ---: | ---: | ---: |"]
    for h in table:
        if h.memory is None:
            continue
        r = h.row.run
        lines.append(f"| {r.name} | {r.memory_gib:.1f} | {r.memory_gib * h.memory:.1f} | "
                     f"{h.memory:.2f}{_edge(h.memory, MEMORY_LIMIT)} | "
                     f"{h.row.live_peak / GiB:.1f} |")
    return "\n".join(lines)


def calibration_table(judged: Sequence[Justification]) -> str:
    """Each fitted number: its value, its rows, its null and what it does held out."""
    lines = ["| Fitted number | Value | Fitted on | Null | Held out: improves / harms "
             "(summed abs. log error) |", "| --- | ---: | --- | --- | --- |"]
    for j in judged:
        rows = FIT_ROWS[j.name]
        named = "; ".join(rows) if len(rows) <= 3 else f"{len(rows)} rows (above)"
        verdict = "kept" if j.justified else "NOT JUSTIFIED"
        lines.append(f"| `{j.name}` | {getattr(CALIBRATION, j.name):g} | {named} | "
                     f"{NULLS[j.name]} | {j.improves:.3f} / {j.harms:.3f}: {verdict} |")
    return "\n".join(lines)


def sources_table() -> str:
    """Every published row: its source, what it states and what the planner assumes."""
    from torchtitan_like.tools.planner.published import PUBLISHED_RUNS

    lines = ["| Run | Source | Stated | Assumed |", "| --- | --- | --- | --- |"]
    for r in PUBLISHED_RUNS:
        lines.append(f"| {r.name} | {r.source} | {r.inputs} | {r.assumed or '-'} |")
    return "\n".join(lines)


def all_tables(table: Sequence[HeldOut] | None = None,
               judged: Sequence[Justification] | None = None) -> str:
    """The four tables, as docs/planner-throughput.md holds them (``table``: the held-out
    table, ``judged``: the fitted numbers' justifications, computed when not given)."""
    table = table or held_out()
    judged = judged or justifications(table=table)
    return "\n\n".join([throughput_table(table), memory_table(table),
                        calibration_table(judged), sources_table()])


def record(table: Sequence[HeldOut]) -> dict[str, tuple[float, float | None, dict[str, float]]]:
    """What ttl-plan reads of the held-out table (uncertainty.py): per run, the held-out
    throughput and memory ratios and each step-time term's share of its step, rounded."""
    out = {}
    for h in table:
        step = h.row.plan.step
        shares = {k: round(v / step.total, 2) for k, v in step.parts().items()
                  if v / step.total >= 0.005}
        out[h.row.run.name] = (round(h.throughput, 3),
                               None if h.memory is None else round(h.memory, 3), shares)
    return out


def record_module(table: Sequence[HeldOut]) -> str:
    """The source of tools/planner/heldout_record.py."""
    lines = ['"""The held-out table of the published runs, as ttl-plan reads it '
             '(tools/planner/uncertainty.py):',
             'per run, the held-out throughput ratio, the held-out reserved-memory ratio (None: '
             'not',
             'published) and each step-time term\'s share of its step. Written by',
             '``python scripts/plan_published.py --record``; tests/unit/test_planner_published.py'
             ' checks',
             'that it is current."""', "",
             "HELD_OUT: dict[str, tuple[float, float | None, dict[str, float]]] = {"]
    for name, (throughput, memory, shares) in record(table).items():
        lines.append(f"    {name!r}: ({throughput}, {memory}, {{")
        items = ", ".join(f"{k!r}: {v}" for k, v in shares.items()) + "}),"
        lines += textwrap.wrap(items, 96, initial_indent=" " * 8, subsequent_indent=" " * 8)
    lines.append("}")
    return "\n".join(lines) + "\n"
