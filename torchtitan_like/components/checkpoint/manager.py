"""The checkpoint manager: the (sync, async, pinned async) saves, with their checksums
(checksums.py); loading is checkpoint/loading.py's."""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from torchtitan_like.components.checkpoint.checksums import ChecksumWriter
from torchtitan_like.components.checkpoint.failure import save_failure
from torchtitan_like.components.checkpoint.folder import (
    partial_name,
    publish,
    purge,
    recover,
    step_folders,
)
from torchtitan_like.components.checkpoint.loading import STATES, CheckpointLoader, data_source
from torchtitan_like.components.checkpoint.staging import StepOrderedStager
from torchtitan_like.components.checkpoint.states import (
    JSONState,
    ModelState,
    OptimizerState,
    TrainState,
    lr_scheduler_state,
)
from torchtitan_like.components.checkpoint.validate import CheckpointError
from torchtitan_like.components.lr_scheduler import LRSchedulersContainer
from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.fault_tolerance import group_name
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.logging import logger
from torchtitan_like.protocols.hf_adapter import HFAdapter

if TYPE_CHECKING:  # the injector builds its writer on checksums.py's: no import cycle
    from torchtitan_like.components.fault_injection import FaultInjector


@dataclasses.dataclass
class SaveRecord:
    """How one save went: ``blocked_s`` is the time the training loop waited for it."""

    step: int
    mode: str
    blocked_s: float = 0.0
    written_s: float | None = None
    """Seconds from the start of the save until it was complete and visible."""


class CheckpointManager:
    """Saves and loads the trainer's state; all logic of checkpointing lives here.

    The trainer calls ``load()`` once after building everything, ``save(step, last)`` at the end
    of every step, ``close()`` after the loop, and ``create_seed()`` for
    ``create_seed_checkpoint``. ``train_state`` is the trainer (its ``state_dict`` holds step and
    tokens seen). ``tied_aliases`` maps the further names of weights tied across pipeline
    stages to their first (distributed/tied_weights.py): each is stored once, under that name.
    """

    def __init__(
        self,
        config: JobConfig,
        *,
        parallel_dims: ParallelDims,
        model_parts: list[nn.Module],
        optimizers: OptimizersContainer,
        lr_schedulers: LRSchedulersContainer,
        dataloader: Any,
        train_state: Any,
        device: torch.device,
        faults: FaultInjector,
        hf_adapter: HFAdapter | None = None,
        tied_aliases: dict[str, str] | None = None,
    ):
        self.config = config
        self.c = config.checkpoint
        self.folder = Path(config.job.dump_folder) / self.c.folder
        # replica groups share the folder, each a writer at times
        self.writer = group_name(config) if config.fault_tolerance.enable else ""
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.parallel_dims = parallel_dims
        self.faults = faults
        self.hf_adapter = hf_adapter
        self.model_parts = model_parts
        self.tied_aliases = tied_aliases or {}
        self.train_state = TrainState(train_state, self.rank, device)
        self.states: dict[str, Any] = {
            "model": ModelState(model_parts, aliases=self.tied_aliases),
            "optimizer": OptimizerState(model_parts, optimizers, self.tied_aliases),
            "lr_scheduler": lr_scheduler_state(lr_schedulers),
            "dataloader": JSONState(dataloader.state_dict, dataloader.load_state_dict),
            "train_state": self.train_state,
        }
        self.records: list[SaveRecord] = []
        self._postponed = False  # a due save waits for a step that is not a spike
        self.loaded_from: Path | None = None
        self._in_flight: Future | None = None
        self._staging: Future | None = None
        self._stager: StepOrderedStager | None = None
        needed = self.c.enable or bool(self.c.initial_load_path)
        # Checkpoint collectives (DCP's plans, the load checks) run on their own gloo group: a
        # CPU group for NCCL jobs, and one that async saves' threads never share with training.
        # Its timeout stays [comm] init_timeout_seconds: a save's last collective waits for the
        # slowest rank's writes, which may take longer than a training step's collectives.
        timeout = datetime.timedelta(seconds=config.comm.init_timeout_seconds)
        self.pg = dist.new_group(backend="gloo", timeout=timeout) if needed else None
        if self.c.enable and self.c.async_mode == "async_with_pinned_mem":
            self._stager = StepOrderedStager(device)  # after the step; /dev/shm checked
            for optimizer in optimizers.optimizers:
                optimizer.register_step_pre_hook(self._wait_for_staging)

    # --- loading (checkpoint/loading.py) ---

    def load(self) -> None:
        """Resume from the latest complete checkpoint (or ``load_step``; an earlier one after
        damage, when allowed), else load the initial weights (``initial_load_path``), else
        leave the fresh initialisation."""
        if self.pg is None:
            return
        if self.rank == 0 and self.c.enable:
            recover(self.folder, self.writer)
        dist.barrier(group=self.pg)
        if self.c.create_seed_checkpoint:
            found = step_folders(self.folder)
            if found:
                raise CheckpointError(
                    f"create_seed_checkpoint writes step-0 into an empty folder, but {self.folder} "
                    f"holds step(s) {', '.join(map(str, found))}; use another dump_folder")
            return
        loader = CheckpointLoader(self.config, self.folder, self.states, self.pg,
                                  self.train_state, self.global_batch_size, self.hf_adapter)
        self.loaded_from = loader.resume() if self.c.enable else None
        if self.loaded_from is None and self.c.initial_load_path:
            loader.load_initial(Path(self.c.initial_load_path))

    # --- saving ---

    @property
    def global_batch_size(self) -> int:
        t = self.config.training
        return (t.global_batch_size if t.global_batch_size != -1
                else t.local_batch_size * self.parallel_dims.dp)

    def _info(self, step: int, states: list[str], dtype: str) -> dict[str, Any]:
        return {
            "step": step,
            "states": states,
            "dtype": dtype,
            "model": {"name": self.config.model.name, "flavor": self.config.model.flavor,
                      "overrides": self.config.model.overrides},
            "optimizer": self.config.optimizer.name,
            "world_size": self.world_size,
            "layout": {k: v for k, v in dataclasses.asdict(self.parallel_dims).items()
                       if k != "world_size"},
            "data": data_source(self.config),
            "global_batch_size": self.global_batch_size,
            "seq_len": self.config.training.seq_len,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__,
            **({"writer": self.writer} if self.writer else {}),  # the replica group
        }

    def save(self, step: int, last: bool = False, postpone: bool = False) -> None:
        """Save after ``step`` when due: every ``interval`` steps and after the last one.
        ``postpone`` (a loss spike at ``step``, components/spikes.py): a due save waits for the
        next call without it, so that no checkpoint holds a spike's state."""
        due = last or step % self.c.interval == 0 or self._postponed
        if not self.c.enable or not due:
            return
        if postpone:
            self._postponed = True
            logger.warning(f"checkpoint of step {step} postponed: step {step} was a spike"
                           + ("; it was the last step, so no checkpoint is written of it"
                              if last else ""))
            return
        self._postponed = False
        self._wait()
        start = time.perf_counter()
        if last and self.c.last_save_model_only:
            dtype = self.c.export_dtype
            states = {"model": ModelState(self.model_parts, DTYPES[dtype], self.tied_aliases)}
        else:
            dtype, states = self.config.training.dtype, dict(self.states)
            if self.rank != 0:  # the stream position is every rank's: rank 0 writes it
                states["dataloader"] = {}
        mode = "disabled" if last else self.c.async_mode  # the last save is waited for anyway
        record = SaveRecord(step, mode)
        self.records.append(record)
        partial = self.folder / partial_name(step, self.writer)
        writer = self.faults.storage_writer(str(partial), step) or ChecksumWriter(partial)
        info = self._info(step, [n for n in STATES if n in states], dtype)
        try:
            upload = self._start_save(mode, states, writer)
        except (Exception, CheckpointException) as e:  # the latter is a BaseException
            raise save_failure(e, step, self.folder, self._newest()) from e
        self._in_flight = _in_background(self._finish, upload, partial, info, record, start)
        record.blocked_s += time.perf_counter() - start
        logger.info(f"checkpoint step {step}: {mode if mode != 'disabled' else 'sync'} save "
                    f"of {', '.join(states)}; the loop waited {record.blocked_s:.3f} s")
        if last:
            self._wait()

    def _start_save(self, mode: str, states: dict[str, Any], writer: ChecksumWriter) -> Future:
        """Start DCP's save in ``mode``; the future completes once it is written everywhere."""
        if mode == "disabled":
            dcp.save(states, storage_writer=writer, process_group=self.pg)
            upload: Future = Future()
            upload.set_result(None)
        elif mode == "async":
            upload = dcp.async_save(states, storage_writer=writer, process_group=self.pg,
                                    async_checkpointer_type=AsyncCheckpointerType.THREAD)
        else:
            response = dcp.async_save(states, storage_writer=writer, process_group=self.pg,
                                      async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                                      async_stager=self._stager)
            self._staging, upload = response.staging_completion, response.upload_completion
        return upload

    def _newest(self) -> Path | None:
        """The newest complete checkpoint (what a failed save leaves as the latest)."""
        found = step_folders(self.folder)
        return found[max(found)] if found else None

    def _finish(self, upload: Future, partial: Path, info: dict[str, Any], record: SaveRecord,
                start: float) -> None:
        """In the background: once the save completed everywhere, rank 0 publishes it and
        deletes what it supersedes."""
        upload.result()
        if self.rank == 0:
            publish(partial, self.folder / f"step-{info['step']}", info)
            purge(self.folder, self.c.keep_latest_k)
            logger.info(f"checkpoint step {info['step']}: complete after "
                        f"{time.perf_counter() - start:.2f} s")
        record.written_s = time.perf_counter() - start

    def _wait_for_staging(self, *_: Any) -> None:
        """Before an optimizer step: the background copy of the last save must be done."""
        if self._staging is not None:
            start = time.perf_counter()
            self._staging.result()
            self._staging = None
            self.records[-1].blocked_s += time.perf_counter() - start

    def _wait(self) -> None:
        """Wait for the save in flight (at most one); raise if it failed."""
        if self._in_flight is None:
            return
        start = time.perf_counter()
        step = self.records[-1].step if self.records else -1
        try:
            self._in_flight.result()
        except (Exception, CheckpointException) as e:  # the latter is a BaseException
            raise save_failure(e, step, self.folder, self._newest()) from e
        finally:
            self._in_flight, self._staging = None, None
        if self.records:
            self.records[-1].blocked_s += time.perf_counter() - start

    def create_seed(self) -> bool:
        """With ``create_seed_checkpoint``: save the initial weights as step-0 (model only)."""
        if not self.c.create_seed_checkpoint:
            return False
        partial = self.folder / "step-0.partial"  # one process (validate_checkpoint)
        dcp.save({"model": self.states["model"]}, storage_writer=ChecksumWriter(partial),
                 process_group=self.pg)
        publish(partial, self.folder / "step-0",
                self._info(0, ["model"], self.config.training.dtype))
        logger.info(f"checkpoint: seed checkpoint written to {self.folder / 'step-0'}")
        return True

    def close(self) -> None:
        """Wait for the last save and release the background machinery."""
        self._wait()
        if self._stager is not None:
            self._stager.close()


def _in_background(fn: Callable[..., None], *args: Any) -> Future:
    """Run ``fn(*args)`` in a daemon thread; its future holds the outcome. Daemon: a save that
    hangs on a lost peer must not keep the process alive after the job failed (a pool's
    threads are joined at exit, so torchrun would see a live worker and never restart)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # DCP's CheckpointException too: for whoever waits
            future.set_exception(e)

    threading.Thread(target=run, daemon=True, name="checkpoint-publish").start()
    return future
