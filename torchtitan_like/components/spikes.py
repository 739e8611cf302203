"""Loss and gradient-norm spikes: told from the curve's own noise, reported, and acted on.

Every step, before the optimizer step, the global loss and the global gradient norm are
compared with a running baseline of the last ``[spike] window`` steps. The comparison is made
on logarithms, because both signals vary multiplicatively (a gradient norm that doubles is the
same event at 0.5 as at 5): with ``m`` the median of the window's logs and
``s = max(1.4826 x MAD, MIN_LOG_SPREAD)`` their robust standard deviation (1.4826 x the median
absolute deviation estimates the standard deviation of normal noise, and one outlier moves
neither the median nor the MAD by more than one rank), a step is a spike when

    log(value) > m + factor x s,   i.e.   value > exp(m) x exp(factor x s).

A falling loss is never a spike (only jumps upwards count). On the shipped default job
(train_configs/debug_model.toml, 100 steps) the largest normal excursions are 6.8 s (loss) and
7.6 s (gradient norm, a 4x jump that recovers the next step) with the default window of 50, so
the default factor of 15 leaves a margin of 2. The limits this gives there (steps 60-100) are
2.1-2.9x the median loss and 17-90x the median gradient norm, whose steps vary much more.

Policies (``[spike] policy``): ``warn`` logs the spike (console and a ``metrics.jsonl`` event)
and keeps the update; ``skip`` also discards the update (no optimizer or LR-schedule step: the
run continues exactly as a run whose data lacks that step's batches would, one step later);
``stop`` skips like ``skip`` and raises ``TrainingDiverged`` (exit code 3) at the
``max_consecutive``-th spike in a row, naming the step and its samples. A spike step's
checkpoint is postponed to the next step that is not one, so no checkpoint is written from a
spike. The baseline is part of the checkpoint (``state_dict``): a resumed run judges its steps
exactly as the uninterrupted run would.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import statistics
from collections.abc import Callable
from typing import Any

from torchtitan_like.config.job_config import Spike as SpikeConfig
from torchtitan_like.logging import logger

MAD_TO_STD = 1.4826
"""Standard deviation of normal noise per unit of median absolute deviation (1 / Phi^-1(3/4))."""

MIN_LOG_SPREAD = 0.02
"""Floor of the robust spread of the logs (2% noise): a flat curve's ripples are no spikes."""

SIGNALS = ("loss", "grad_norm")


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm stopped being finite, or spiked ``max_consecutive`` times
    in a row under ``[spike] policy = "stop"`` (exit code 3)."""


@dataclasses.dataclass
class SpikeVerdict:
    """One step's check: the limits it was held to and what the policy does with it."""

    values: dict[str, float]
    limits: dict[str, float]
    """Per signal, the value above which it is a spike (absent while the window fills)."""
    skip_update: bool = False

    @property
    def spiked(self) -> list[str]:
        return [name for name, limit in self.limits.items() if self.values[name] > limit]


class SpikeDetector:
    """The running baseline of loss and gradient norm, and the policy acting on spikes."""

    def __init__(self, config: SpikeConfig, samples_per_step: int):
        self.config = config
        self.samples_per_step = samples_per_step  # the global batch, to name a step's data
        self.windows = {name: collections.deque(maxlen=config.window) for name in SIGNALS}
        self.streak = 0  # spikes in a row, up to the last checked step
        self.flagged_step = 0  # the last step that was a spike

    @property
    def enabled(self) -> bool:
        return self.config.policy != "off"

    def _limit(self, name: str) -> float | None:
        window = self.windows[name]
        if len(window) < window.maxlen:
            return None
        median = statistics.median(window)
        spread = max(MAD_TO_STD * statistics.median(abs(v - median) for v in window),
                     MIN_LOG_SPREAD)
        return math.exp(median + self.config.factor * spread)

    def check(self, step: int, values: dict[str, float]) -> SpikeVerdict:
        """Judge one step against the baseline before its update, then add it to the
        baseline (spikes too: the median is robust to them, and a lasting change of level
        becomes the new normal after window / 2 steps)."""
        limits = {name: limit for name in SIGNALS if (limit := self._limit(name)) is not None}
        verdict = SpikeVerdict(values, limits)
        for name in SIGNALS:
            self.windows[name].append(math.log(max(values[name], 1e-30)))
        if not verdict.spiked:
            self.streak = 0
            return verdict
        self.streak += 1
        self.flagged_step = step
        verdict.skip_update = self.config.policy in ("skip", "stop")
        return verdict

    def skips_update(self, step: int, loss: float, grad_norm: float,
                     log_event: Callable[[dict[str, Any]], None]) -> bool:
        """Check one step (called between backward and the optimizer step): report a spike
        through ``log_event``, stop the run on a streak; True when its update is to be
        discarded."""
        verdict = self.check(step, {"loss": loss, "grad_norm": grad_norm})
        if verdict.spiked:
            log_event(self.report(step, verdict))
            if self.config.policy == "stop" and self.streak >= self.config.max_consecutive:
                raise TrainingDiverged(self._stop_reason(step, verdict))
        return verdict.skip_update

    def _stop_reason(self, step: int, verdict: SpikeVerdict) -> str:
        first = (step - 1) * self.samples_per_step
        return (f"step {step}: {self.streak} loss/grad-norm spike(s) in a row ({_describe(verdict)}"
                f"); this step's data: samples {first}-{first + self.samples_per_step - 1} of "
                f"the training stream ({self.samples_per_step} a step). Its update and those of "
                "the spikes before it were skipped, and no checkpoint was written from a spike: "
                "the latest checkpoint is good. Check that data, or resume with [spike] policy "
                "= \"skip\"")

    def report(self, step: int, verdict: SpikeVerdict) -> dict[str, Any]:
        """Log the spike; returns its ``metrics.jsonl`` event record."""
        action = "update skipped" if verdict.skip_update else "update kept"
        logger.warning(f"spike at step {step}: {_describe(verdict)}; {action} "
                       f"([spike] policy = {self.config.policy!r}, {self.streak} in a row)")
        record: dict[str, Any] = {"step": step, "spike": True}
        for name in verdict.spiked:
            record[f"spike_{name}"] = verdict.values[name]
            record[f"spike_{name}_limit"] = verdict.limits[name]
        record.update(spike_update_skipped=verdict.skip_update, spike_streak=self.streak)
        return record

    def holds_checkpoint(self, step: int) -> bool:
        """True when ``step`` was a spike: its checkpoint waits for the next healthy step."""
        return self.flagged_step == step

    def state_dict(self) -> dict[str, str]:
        """JSON text (one opaque value in the checkpoint, whatever the windows' lengths);
        floats round-trip exactly through ``repr``."""
        return {"spike_detector": json.dumps({
            "windows": {name: list(window) for name, window in self.windows.items()},
            "streak": self.streak, "flagged_step": self.flagged_step})}

    def load_state_dict(self, state: dict[str, str]) -> None:
        saved = json.loads(state["spike_detector"])
        for name in SIGNALS:
            self.windows[name].clear()
            self.windows[name].extend(saved["windows"][name])
        self.streak, self.flagged_step = saved["streak"], saved["flagged_step"]


def _describe(verdict: SpikeVerdict) -> str:
    return ", ".join(f"{name} {verdict.values[name]:.4g} > limit {verdict.limits[name]:.4g}"
                     for name in verdict.spiked)
