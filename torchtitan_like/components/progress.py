"""Where a run stands: ``step 12/100``, time elapsed, an ETA and the tokens seen so far.

The ETA extrapolates this run's mean time per step (checkpoint saves and validations
included, since they recur) over the remaining steps; a resumed run counts from its resume
step. Only host clocks are read: nothing here waits for the device.
"""

from __future__ import annotations

import datetime
import time


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class Progress:
    def __init__(self, total_steps: int, start_step: int = 0):
        self.total_steps = total_steps
        self.start_step = start_step
        self.started: float | None = None  # at the first step of this run, not at start-up

    def step_started(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def fields(self, step: int) -> dict[str, float]:
        """``elapsed_seconds`` of this run and ``eta_seconds`` to the last step."""
        elapsed = 0.0 if self.started is None else time.perf_counter() - self.started
        done = max(step - self.start_step, 1)
        return {"elapsed_seconds": elapsed,
                "eta_seconds": elapsed / done * (self.total_steps - step)}

    def text(self, step: int, fields: dict[str, float], tokens_seen: int | None) -> str:
        tokens = "" if tokens_seen is None else f"  tokens {tokens_seen:,}"
        return (f"step {step}/{self.total_steps}  elapsed {_clock(fields['elapsed_seconds'])}  "
                f"eta {_clock(fields['eta_seconds'])}{tokens}")
