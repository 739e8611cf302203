"""Fault injection: kill one rank at a chosen step, once, so that recovery is tested, not hoped for;
spike one step's loss; slow one rank down.

``[debug] fault_rank = r, fault_step = s`` SIGKILLs rank r (no clean-up, like a lost node) at
step s, at one of two points:

- ``step``: after step s (its metrics are logged), before its checkpoint is saved;
- ``save``: inside the checkpoint of step s, after this rank's files are written but before the
  save completes on all ranks, i.e. the worst moment for a checkpoint to be cut short.

Two faults slow or spoil a run instead of killing it, on every run of their step (like a
corrupted batch or a slow host, they come back when the step is run again):

- ``[debug] spike_step = s``: step s's loss, and so its gradients, are multiplied by
  ``spike_scale`` (the loss normaliser is divided by it), for the spike policies of
  components/spikes.py;
- ``[debug] slow_rank = r``: rank r sleeps ``slow_rank_seconds`` in every step's data loading,
  a straggler for components/stragglers.py to name.

"Once" survives the restart: before dying, the rank writes a marker file into the dump folder,
and a job that finds the marker runs without the fault. Under ``torchrun --max-restarts`` (the
``MAX_RESTARTS`` of run_train.sh) the job then restarts and resumes from the latest complete
checkpoint; to inject again, delete the marker or use another dump folder.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch

from torchtitan_like.components.checkpoint.checksums import ChecksumWriter
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.logging import logger


def validate_faults(config: JobConfig, world_size: int) -> None:
    """ConfigError for a fault that can never fire."""
    d, c = config.debug, config.checkpoint
    if not 0 <= d.spike_step <= config.training.steps:
        raise ConfigError(f"[debug] spike_step = {d.spike_step}: must be 0 (off) or a step in "
                          f"1..{config.training.steps} ([training] steps)")
    if not -1 <= d.slow_rank < world_size:
        raise ConfigError(f"[debug] slow_rank = {d.slow_rank}: must be -1 (off) or a rank in "
                          f"0..{world_size - 1} of this {world_size}-process job")
    if d.fault_rank == -1:
        return
    if not 0 <= d.fault_rank < world_size:
        raise ConfigError(f"[debug] fault_rank = {d.fault_rank}: must be -1 (off) or a rank "
                          f"in 0..{world_size - 1} of this {world_size}-process job")
    if not 1 <= d.fault_step <= config.training.steps:
        raise ConfigError(f"[debug] fault_step = {d.fault_step}: must be a step in "
                          f"1..{config.training.steps} ([training] steps)")
    if d.fault_point == "save" and not (
        c.enable and (d.fault_step % c.interval == 0 or d.fault_step == config.training.steps)
    ):
        raise ConfigError(
            f'[debug] fault_point = "save" at fault_step = {d.fault_step}: no checkpoint is saved '
            "at that step; set [checkpoint] enable = true and a fault_step that is a multiple "
            f"of [checkpoint] interval ({c.interval}) or the last step"
        )


def _die(trainer_pid: int, marker: Path, message: str) -> None:
    """Record the fault, then SIGKILL the trainer process (and this one, if it is a
    checkpoint writer process of the trainer)."""
    with marker.open("w") as f:
        f.write(message + "\n")
        f.flush()
        os.fsync(f.fileno())
    logger.warning(f"fault injection: {message}; killing process {trainer_pid}")
    for handler in logger.handlers:
        handler.flush()
    os.kill(trainer_pid, signal.SIGKILL)
    os._exit(137)  # only reached in a writer process whose trainer was just killed


class _DyingWriter(ChecksumWriter):
    """The checkpoint writer, killing the trainer right after writing this rank's files, before
    the coordinator can finish the checkpoint. Picklable, so it also works in the writer
    process of ``async_with_pinned_mem``."""

    def __init__(self, path: str, die: Callable[[], None]):
        super().__init__(path)
        self.die = die

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        written.wait()
        self.die()
        return written


class FaultInjector:
    def __init__(self, config: JobConfig, rank: int):
        d = config.debug
        self.step = d.fault_step
        self.point = d.fault_point
        self.marker = Path(config.job.dump_folder) / (
            f".fault_injected_rank{d.fault_rank}_step{d.fault_step}_{d.fault_point}")
        self.armed = d.fault_rank == rank and not self.marker.exists()
        self.spike_step, self.spike_scale = d.spike_step, d.spike_scale
        self.slow_seconds = d.slow_rank_seconds if d.slow_rank == rank else 0.0
        if d.fault_rank != -1 and self.marker.exists():
            logger.info(f"fault injection disarmed: it already fired ({self.marker})")

    def _die(self, step: int) -> Callable[[], None]:
        message = f"rank killed at step {step} ({self.point})"
        return functools.partial(_die, os.getpid(), self.marker, message)

    def after_step(self, step: int) -> None:
        """The ``step`` fault point: called after each step's metrics, before its save."""
        if self.armed and self.point == "step" and step == self.step:
            self._die(step)()

    def storage_writer(self, path: str, step: int) -> ChecksumWriter | None:
        """The writer for the checkpoint of ``step``: a dying one at the ``save`` fault point."""
        if self.armed and self.point == "save" and step == self.step:
            return _DyingWriter(path, self._die(step))
        return None

    def spike(self, step: int, loss_normaliser: torch.Tensor) -> torch.Tensor:
        """The step's loss normaliser (its labelled tokens), divided by ``spike_scale`` at
        ``spike_step``: that step's loss and gradients come out ``spike_scale`` times larger."""
        if self.spike_step and step == self.spike_step:  # 0: no spike
            logger.warning(f"fault injection: step {step}'s loss scaled by {self.spike_scale:g}")
            return loss_normaliser / self.spike_scale
        return loss_normaliser

    def slow_down(self) -> None:
        """The ``slow_rank`` fault: called in every step's data loading."""
        if self.slow_seconds:
            time.sleep(self.slow_seconds)
