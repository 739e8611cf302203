"""What watches every training step from outside the model, behind one object the loop calls
at fixed points:

- **stragglers** (components/stragglers.py): each rank times its data loading (``loading``)
  and its compute (``computing``, from the moment every rank has its data); the logged record
  gets the spread over ranks (``window_stats``);
- **spikes** (components/spikes.py): after the gradient norm, before the update, ``check``
  stops the run on a non-finite norm (weights untouched) and keeps the step's loss and norm
  for ``keeps_update``, a gate of the optimizer step (components/optimizer.py): a spike's
  update is withheld under ``[spike] policy = "skip"`` or ``"stop"``, and its checkpoint waits
  for the next healthy step (``holds_checkpoint``);
- **injected faults** (components/fault_injection.py): a slow rank in ``loading``, a spiked
  loss in ``loss_normaliser``, a killed rank in ``after_step``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchtitan_like.components.fault_injection import FaultInjector
from torchtitan_like.components.spikes import SpikeDetector, TrainingDiverged
from torchtitan_like.components.stragglers import StepClock


class StepWatch:
    """The step's clock, spike detector and fault injector. ``global_sum`` sums a loss share
    over the ranks that hold one (a collective, run only when the spike policy needs the
    global loss); ``log_event`` writes a ``metrics.jsonl`` event (a spike)."""

    def __init__(self, clock: StepClock, spikes: SpikeDetector, faults: FaultInjector,
                 global_sum: Callable[[torch.Tensor], torch.Tensor],
                 log_event: Callable[[dict[str, Any]], None]):
        self.clock, self.spikes, self.faults = clock, spikes, faults
        self.global_sum, self.log_event = global_sum, log_event
        self.step = 0
        """The step in progress (set by ``loading``)."""
        self._checked: tuple[torch.Tensor, float] | None = None  # (loss share, gradient norm)

    @contextlib.contextmanager
    def loading(self, step: int) -> Iterator[None]:
        """Loading step ``step``'s data: this rank's ``data`` phase; the slow_rank fault."""
        self.step = step
        with self.clock.phase("data"):
            self.faults.slow_down()
            yield

    @property
    def data_seconds(self) -> float:
        """This rank's time loading the data of the step in progress."""
        return self.clock.last("data")

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """The step's compute: every rank has its data first (the wait for a late one is spent
        unmeasured), then this rank's ``compute`` phase."""
        self.clock.sync()
        with self.clock.phase("compute"):
            yield

    def loss_normaliser(self, global_tokens: torch.Tensor) -> torch.Tensor:
        """The step's labelled tokens, divided by ``[debug] spike_scale`` at its spike_step."""
        return self.faults.spike(self.step, global_tokens)

    def check(self, loss: torch.Tensor, grad_norm: float) -> None:
        """TrainingDiverged for a non-finite gradient norm (before the optimizer step: weights
        untouched); else the step's values wait for the spike gate (``keeps_update``)."""
        if not math.isfinite(grad_norm):
            raise TrainingDiverged(
                f"step {self.step}: gradient norm is {grad_norm} (local loss share "
                f"{loss.item():.4g}); stopped before the optimizer step, weights untouched. "
                "Lower [optimizer] lr, raise warmup, or check the data."
            )
        self._checked = loss, grad_norm

    def keeps_update(self) -> bool:
        """The optimizer step's spike gate: False when the checked step is a spike whose update
        the policy discards (a ``stop`` streak raises TrainingDiverged)."""
        if not self.spikes.enabled:
            return True
        if self._checked is None:
            raise RuntimeError("[spike] policy is on, but this train_step stepped the optimizer "
                               "without StepWatch.check(loss, grad_norm) first")
        (loss, grad_norm), self._checked = self._checked, None
        return not self.spikes.skips_update(self.step, self.global_sum(loss).item(), grad_norm,
                                            self.log_event)

    def window_stats(self) -> dict[str, Any]:
        """The phase times' spread over ranks since the last call (a collective)."""
        return self.clock.window_stats()

    def after_step(self, step: int) -> None:
        """The end of a counted step, its metrics logged, before its checkpoint: the fault
        point ``step``."""
        self.faults.after_step(step)

    def holds_checkpoint(self, step: int) -> bool:
        """True when ``step`` was a spike: its checkpoint waits for the next healthy step."""
        return self.spikes.holds_checkpoint(step)
