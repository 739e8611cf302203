"""The table ``ttl-plan --search`` prints: the best fitting layouts, ranked, each with why it
beats the next (tools/planner/search.py ranks them)."""

from __future__ import annotations

import itertools
from typing import Any

from torchtitan_like.tools.planner import GiB, ModelShape, Plan, Workload, why_better


def format_search(plans: list[Plan], header: list[str], model: ModelShape, work: Workload,
                  pins: dict[str, Any]) -> str:
    """The ranked layouts under ttl-plan's ``header`` lines, each with why it beats the next
    (``pins``: the layout flags given)."""
    pinned = ", ".join(f"{k} {v}" for k, v in pins.items()) or "nothing"
    lines = [
        *header,
        "",
        f"Best {len(plans)} fitting layouts by predicted step time (the simpler first within "
        f"3%; each with the least activation checkpointing that fits; pinned: {pinned}):",
        f"{'#':>2}  {'tp':>2} {'cp':>2} {'pp':>3}" + (f" {'ep':>3}" if model.is_moe else "")
        + f" {'schedule':15} {'dp (rep x shard)':>17}  "
        f"{'ac':8} "
        f"{'GiB':>6}  {'bubble':>6}  {'tok/s/GPU':>9}  {'MFU':>6}  {'step s':>7}"
        + ("  days" if work.tokens else ""),
    ]
    for i, r in enumerate(plans, 1):
        lay = r.layout
        dp = f"{lay.dp_replicate} x {lay.dp_shard}"
        ac = "every " + lay.ac if lay.ac.isdigit() else lay.ac
        schedule = lay.pp_schedule if lay.pp > 1 else "-"
        ep = f" {lay.ep:>3}" if model.is_moe else ""
        lines.append(f"{i:>2}  {lay.tp:>2} {lay.cp:>2} {lay.pp:>3}{ep} {schedule:15} {dp:>17}  "
                     f"{ac:8} "
                     f"{r.memory.total / GiB:6.1f}  {r.bubble:6.1%}  "
                     f"{r.tokens_per_second_per_gpu:9,.0f}  {r.mfu_estimate:6.1%}  "
                     f"{r.step_seconds:7.2f}" + (f"  {r.days:.1f}" if work.tokens else ""))
    lines += [f"  #{i} over #{i + 1}: {why_better(a, b)}"
              for i, (a, b) in enumerate(itertools.pairwise(plans), 1)]
    if not plans:
        lines.append("  no layout fits: more GPUs, a smaller batch per microbatch or sequence")
    return "\n".join(lines)
