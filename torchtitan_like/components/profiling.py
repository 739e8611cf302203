"""Where to look when MFU is low: torch.profiler traces and CUDA memory snapshots.

Every ``profile_freq`` steps each rank writes one Chrome trace of the last ``profiler_active``
steps of the period (after ``profiler_warmup`` traced-but-discarded steps, so start-up effects
stay out) to ``{dump_folder}/{save_traces_folder}/iteration_<step>/rank<r>_trace.json``; open
it in Perfetto (ui.perfetto.dev) or chrome://tracing to see compute, communication and idle
gaps per rank. On CUDA, ``enable_memory_snapshot`` records the caching allocator's history and
dumps it every ``profile_freq`` steps to ``{save_memory_snapshot_folder}/iteration_<step>/``
(drag the pickle onto pytorch.org/memory_viz). The CPU allocator keeps no such history: measure
CPU memory with ``components/memory.py`` (MemTracker) instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Profiling as ProfilingConfig
from torchtitan_like.logging import logger

MEMORY_HISTORY_ENTRIES = 100_000
"""Allocator events kept for a snapshot (older ones are dropped)."""


def validate(config: ProfilingConfig, device_type: str) -> None:
    if (config.enable_profiling or config.enable_memory_snapshot) and config.profile_freq < 1:
        raise ConfigError(f"[profiling] profile_freq = {config.profile_freq}: must be >= 1")
    if config.enable_profiling:
        if config.profiler_active < 1 or config.profiler_warmup < 0:
            raise ConfigError("[profiling] profiler_active must be >= 1 and profiler_warmup >= 0")
        if config.profiler_warmup + config.profiler_active > config.profile_freq:
            raise ConfigError(
                f"[profiling] profiler_warmup + profiler_active = {config.profiler_warmup} + "
                f"{config.profiler_active} must fit in profile_freq = {config.profile_freq} steps"
            )
    if config.enable_memory_snapshot and device_type != "cuda":
        raise ConfigError(
            "[profiling] enable_memory_snapshot records the CUDA caching allocator, and this job "
            "runs on CPU; set it false (for CPU memory use scripts/activation_memory.py or "
            "scripts/bench.py, which measure with MemTracker)"
        )


class Profiler:
    """Call ``step(step)`` once after every training step (or run each in ``stepping``);
    ``close()`` at the end."""

    def __init__(self, config: ProfilingConfig, dump_folder: str, rank: int,
                 device: torch.device, start_step: int = 0):
        self.config = config
        self.rank = rank
        self.traces = Path(dump_folder) / config.save_traces_folder
        self.snapshots = Path(dump_folder) / config.save_memory_snapshot_folder
        self.start_step = start_step
        self.closing = False
        self.profiler: torch.profiler.profile | None = None
        if config.enable_profiling:
            period = torch.profiler.schedule(
                wait=config.profile_freq - config.profiler_warmup - config.profiler_active,
                warmup=config.profiler_warmup,
                active=config.profiler_active,
            )
            activities = [ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            # The profiler counts its own steps from 0; the offset keeps a resumed run's traces
            # on the same step numbers as an uninterrupted one.
            self.profiler = torch.profiler.profile(
                activities=activities,
                schedule=lambda n: period(n + start_step),
                on_trace_ready=self._save_trace,
                record_shapes=True,
            )
            self.profiler.start()
        if config.enable_memory_snapshot:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)

    def _save_trace(self, profiler: torch.profiler.profile) -> None:
        if self.closing:  # a period cut short by the end of training: no complete trace
            return
        folder = self.traces / f"iteration_{self.start_step + profiler.step_num}"
        folder.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(folder / f"rank{self.rank}_trace.json"))
        if self.rank == 0:
            logger.info(f"profiler trace written to {folder}")

    def step(self, step: int) -> None:
        if self.profiler is not None:
            self.profiler.step()
        if self.config.enable_memory_snapshot and step % self.config.profile_freq == 0:
            folder = self.snapshots / f"iteration_{step}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"rank{self.rank}_memory_snapshot.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            if self.rank == 0:
                logger.info(f"CUDA memory snapshot written to {folder}")

    @contextlib.contextmanager
    def stepping(self, step: int) -> Iterator[None]:
        """Around the attempt of step ``step``: ``step`` after it, however it ended (a step the
        replica groups dropped is a traced step too)."""
        try:
            yield
        finally:
            self.step(step)

    def close(self) -> None:
        if self.profiler is not None:
            self.closing = True
            self.profiler.stop()
            self.profiler = None
        if self.config.enable_memory_snapshot:
            torch.cuda.memory._record_memory_history(enabled=None)
