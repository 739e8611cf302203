"""The search: every layout of the cluster that honours what the user pinned, planned with the
least activation checkpointing that fits, ranked by predicted step time, the simpler layout
first when two are within ``SIMPLER_WITHIN`` of each other, each with why it beats the next.

Free degrees range over powers of two: TP within a node (the trainer warns past it, and its
per-layer collectives would cross the network), CP up to 16 (only when nothing fits without
it), PP up to 64; FSDP takes the rest of the ranks, or HSDP with one shard group per node;
for an MoE model, EP over the powers of two that divide both its routed experts and the ranks
it borrows (dp_shard x cp x tp).
A pinned degree or option (``pins``: any ``Layout`` field, e.g. ``{"tp": 8, "cp": 1,
"float8": True}``) is never changed; an unpinned pipeline schedule is 1F1B or Interleaved1F1B.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from torchtitan_like.tools.planner.inputs import (
    Cluster,
    GiB,
    Layout,
    LayoutError,
    ModelShape,
    Workload,
)
from torchtitan_like.tools.planner.layout_plan import Plan, plan_fitting

SIMPLER_WITHIN = 0.03
"""Predicted step times this close (relative) count as a tie, broken by simplicity."""

DEGREES = ("tp", "cp", "pp", "dp_replicate", "dp_shard", "ep")


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else [1]


def _expert_degrees(num_experts: int, borrowed: int, pins: dict[str, Any]) -> list[int]:
    """EP degrees to try: the pinned one, else 1 and every power of two dividing both the
    routed experts and the borrowed ranks (none but 1 for a dense model)."""
    if "ep" in pins:
        return [pins["ep"]]
    return [ep for ep in _powers_of_two(num_experts or 1)
            if num_experts % ep == 0 and borrowed % ep == 0]


def candidates(cluster: Cluster, pins: dict[str, Any], num_experts: int = 0
               ) -> Iterator[Layout]:
    """Every layout of the cluster's GPUs that keeps the pinned fields (ac "auto" unless
    pinned); ``num_experts``: the model's routed experts per MoE block (0: dense)."""
    n = cluster.num_gpus
    options = {k: v for k, v in pins.items() if k not in DEGREES}
    options.setdefault("ac", "auto")
    pinned_schedule = options.pop("pp_schedule", None)
    tps = [pins["tp"]] if "tp" in pins else _powers_of_two(cluster.gpus_per_node)
    cps = [pins["cp"]] if "cp" in pins else _powers_of_two(16)
    pps = [pins["pp"]] if "pp" in pins else _powers_of_two(min(n, 64))
    for tp, cp, pp in itertools.product(tps, cps, pps):
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        if "dp_replicate" in pins or "dp_shard" in pins:
            shard = pins.get("dp_shard", dp // pins.get("dp_replicate", 1))
            if shard < 1 or dp % shard or dp // shard != pins.get("dp_replicate", dp // shard):
                continue
            shards = {shard}
        else:
            per_node = cluster.gpus_per_node // (tp * cp)
            shards = {dp} | ({per_node} if 1 < per_node < dp and dp % per_node == 0 else set())
        schedules = [pinned_schedule] if pinned_schedule else \
            ["1F1B"] if pp == 1 else ["1F1B", "Interleaved1F1B"]
        for dp_shard, schedule in itertools.product(sorted(shards), schedules):
            for ep in _expert_degrees(num_experts, dp_shard * cp * tp, pins):
                yield Layout(dp_replicate=dp // dp_shard, dp_shard=dp_shard, cp=cp, tp=tp,
                             pp=pp, pp_schedule=schedule, ep=ep, **options)


def complexity(layout: Layout) -> tuple[int, ...]:
    """Fewer parallel dimensions first, then less pipelining, CP, TP, EP and recomputation."""
    used = sum(d > 1 for d in (layout.tp, layout.cp, layout.pp, layout.dp_replicate, layout.ep))
    ac = {"none": 0, "op": 1, "full": 99}.get(layout.ac, 0)
    return (used, layout.pp, layout.cp, layout.tp, layout.ep, ac if not layout.ac.isdigit() else
            100 // int(layout.ac))


def rank(plans: list[Plan], within: float = SIMPLER_WITHIN) -> list[Plan]:
    """Fastest first, except that among layouts within ``within`` of the fastest remaining
    one the simplest goes first."""
    left = sorted(plans, key=lambda p: (p.step_seconds, p.memory.total))
    ranked = []
    while left:
        ties = [p for p in left if p.step_seconds <= left[0].step_seconds * (1 + within)]
        best = min(ties, key=lambda p: (complexity(p.layout), p.step_seconds))
        ranked.append(best)
        left.remove(best)
    return ranked


def search(m: ModelShape, cluster: Cluster, work: Workload, *, pins: dict[str, Any] | None = None,
           top: int = 5, **kwargs: Any) -> list[Plan]:
    """The ``top`` fitting layouts (see the module docstring). Unless CP is pinned, layouts
    with CP are searched only when none without fits: CP splits the same work over more
    ranks to fit a long sequence, and the model prices its costs (short attention chunks,
    ring-step latency) too low to rank it fairly against layouts without it."""
    pins = pins or {}
    plans = _fitting(m, cluster, work, pins if "cp" in pins else {**pins, "cp": 1}, kwargs)
    if not plans and "cp" not in pins:
        plans = _fitting(m, cluster, work, pins, kwargs)
    return rank(plans)[:top]


def _fitting(m: ModelShape, cluster: Cluster, work: Workload, pins: dict[str, Any],
             kwargs: dict[str, Any]) -> list[Plan]:
    plans = []
    for layout in candidates(cluster, pins, m.num_experts):
        try:
            result = plan_fitting(m, cluster, work, layout, **kwargs)
        except LayoutError:
            continue
        if result.fits:
            plans.append(result)
    return plans


def why_better(a: Plan, b: Plan) -> str:
    """Why ``a`` ranks above ``b``: the step-time parts that differ most, and memory."""
    gain = b.step_seconds - a.step_seconds
    if gain <= 0:  # promoted over a faster layout by the near-tie rule
        head = f"simpler, within {SIMPLER_WITHIN:.0%} ({-gain:.2f} s slower)"
    else:
        head = f"{gain:.2f} s faster"
    parts_a, parts_b = a.step.parts(), b.step.parts()
    diffs = sorted(((parts_b[k] - parts_a[k], k) for k in parts_a), reverse=True)
    reasons = [f"{k} {d:.2f} s less" for d, k in diffs[:2] if d > 0.005 * b.step_seconds]
    room = (a.usable_gib * GiB - a.memory.total) - (b.usable_gib * GiB - b.memory.total)
    if abs(room) >= 0.5 * GiB:
        reasons.append(f"{abs(room) / GiB:.1f} GiB {'more' if room > 0 else 'less'} headroom")
    return head + (": " + ", ".join(reasons) if reasons else "")

