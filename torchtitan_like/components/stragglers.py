"""Which rank holds the job back: every rank times its own steps, rank 0 logs the spread.

Each step, every rank measures on its host clock

- ``data``: loading its microbatches (purely local work);
- ``compute``: the training step, from the moment all ranks have their data to the end of
  the optimizer step.

Between the two, ``sync`` is a one-number all-reduce over all ranks (a CPU tensor: gloo, on
GPUs too, so the device is not waited for): a rank that was slow to load its data makes the
others wait *there*, outside both measured phases, instead of inside their compute at the
step's first collective. A rank's own time for the step is ``data + compute``.

At every logged step each rank takes the median of its per-step times over the steps since
the last log (a median, so one hiccup does not count: a rank must *stay* slow), all ranks
gather them, and the record gets, over ranks, ``data_seconds_{min,median,max}``,
``compute_seconds_{min,median,max}``, ``slowest_rank`` (largest data + compute) and
``slowest_rank_excess`` (its step time over the median of the other ranks', as a fraction:
with 2 ranks, over the other rank's). A warning names the slowest rank when the excess is
above ``[metrics] straggler_threshold`` (not for the first window, which holds each rank's
warm-up: first kernels, compilation).

What wall clocks can tell: a rank slow in its data loading, or in the part of its step after
its last collective (the optimizer step, the end of backward), stands out. A rank slow inside
forward or backward makes every other rank wait in the layout's own collectives (FSDP's
all-gathers, TP's all-reduces, PP's sends), so all ranks show the same compute time and no
rank is named. Under PP, stages of unequal cost show as a spread too. On CUDA the step's
gradient-norm read waits for the device, so ``compute`` covers the device's forward and
backward.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from torchtitan_like.logging import logger

PHASES = ("data", "compute")
RECORD_KEYS = frozenset({f"{phase}_seconds_{stat}" for phase in PHASES
                         for stat in ("min", "median", "max")}
                        | {"slowest_rank", "slowest_rank_excess"})
"""The fields ``window_stats`` adds to a logged step's record."""


class StepClock:
    """Per-rank phase times of the steps since the last log, and their spread over ranks."""

    def __init__(self, world_size: int, threshold: float):
        self.world_size = world_size
        self.threshold = threshold
        self.times: dict[str, list[float]] = {phase: [] for phase in PHASES}
        self.warm = False  # the first window holds the warm-up (first kernels, compilation)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[name].append(time.perf_counter() - start)

    def last(self, name: str) -> float:
        return self.times[name][-1]

    def sync(self) -> None:
        """All ranks have their data: the wait for a late one is spent here, unmeasured."""
        if self.world_size > 1:
            dist.all_reduce(torch.zeros(1))

    def window_stats(self) -> dict[str, Any]:
        """The spread over ranks of each rank's median phase times since the last call
        (a collective: every rank calls it at the same steps). Warns about a straggler."""
        mine = [statistics.median(self.times[phase]) for phase in PHASES]
        self.times = {phase: [] for phase in PHASES}
        gathered = torch.tensor(mine, dtype=torch.float64)
        if self.world_size > 1:
            table = [torch.zeros_like(gathered) for _ in range(self.world_size)]
            dist.all_gather(table, gathered)
            gathered = torch.stack(table)
        per_rank = gathered.reshape(self.world_size, len(PHASES)).tolist()
        stats = self.summarise(per_rank, warn=self.warm)
        self.warm = True
        return stats

    def summarise(self, per_rank: list[list[float]], warn: bool = True) -> dict[str, Any]:
        """``per_rank[r]`` = rank r's median (data, compute) seconds -> the record's fields."""
        stats: dict[str, Any] = {}
        for i, phase in enumerate(PHASES):
            column = [times[i] for times in per_rank]
            stats.update({f"{phase}_seconds_min": min(column),
                          f"{phase}_seconds_median": statistics.median(column),
                          f"{phase}_seconds_max": max(column)})
        steps = [sum(times) for times in per_rank]
        slowest = max(range(len(steps)), key=steps.__getitem__)
        others = steps[:slowest] + steps[slowest + 1:]  # of 2 ranks: the other one
        typical = statistics.median(others) if others else steps[slowest]
        excess = steps[slowest] / typical - 1 if typical > 0 else 0.0
        stats.update(slowest_rank=slowest, slowest_rank_excess=excess)
        if warn and self.threshold > 0 and excess > self.threshold:
            data, compute = per_rank[slowest]
            logger.warning(
                f"straggler: rank {slowest} takes {steps[slowest]:.3f} s a step (median since "
                f"the last log: data {data:.3f} s, compute {compute:.3f} s), {100 * excess:.0f}% "
                f"over the other ranks' median of {typical:.3f} s ([metrics] "
                f"straggler_threshold = {self.threshold:g})")
        return stats
