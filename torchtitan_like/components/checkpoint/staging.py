"""The stager of ``async_with_pinned_mem`` saves: ordered after the optimizer step, and checked
against the free shared memory before its first copy.

**Order.** DCP's DefaultStager copies the state to pinned memory on its own CUDA stream, in a
background thread. Nothing orders that stream after the training stream: the optimizer step that
precedes a save is only *queued* when ``save`` runs, so the copy could read weights from before
the step (unless something, e.g. a logged ``.item()``, happened to synchronise). So ``stage``
records an event on the training stream (in the training thread, after the step was queued) and
the background thread waits for it before copying. The loop itself never blocks on it. On the CPU
every op has finished when it returns, so there is nothing to wait for.

**Space.** Pinned staging keeps the copy in shared memory (``/dev/shm``): each rank of a node
needs about its share of the state there (8B model: ~12 GB a rank, ~96 GB for 8 ranks). Running
out surfaces as a bus error in the middle of a copy, so before the first copy the node's need
(this rank's bytes x local ranks) is checked against the free space and refused with a clear
message. Later saves reuse the same buffers.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.tensor import DTensor

from torchtitan_like.components.checkpoint.validate import CheckpointError

SHM = "/dev/shm"


class StepDone(Protocol):
    """Marks the end of the work queued so far on the training stream."""

    def synchronize(self) -> None: ...


def mark_training_stream(device: torch.device) -> StepDone | None:
    """An event recorded on ``device``'s current stream (None on the CPU: nothing is queued)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def shm_free_bytes() -> int:
    return shutil.disk_usage(SHM).free


def state_bytes(state: Any) -> int:
    """Bytes this rank's tensors of a (nested) state dict occupy (DTensors: the local shard)."""
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    if isinstance(state, DTensor):
        state = state.to_local()
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    return 0


def staging_options(device: torch.device) -> StagingOptions:
    """Pinned memory and non-blocking copies on an accelerator; on CPU (where both need one)
    plain shared memory, still staged in the background."""
    accelerator = device.type != "cpu"
    return StagingOptions(use_pinned_memory=accelerator, use_shared_memory=True,
                          use_async_staging=True, use_non_blocking_copy=accelerator)


class StepOrderedStager(DefaultStager):
    """DefaultStager whose background copy starts only after the training stream's queued work
    (the optimizer step) is done, and whose first copy is checked against ``/dev/shm``.

    ``mark`` and ``free_bytes`` are parameters so that tests can stand in a slow stream and a
    small ``/dev/shm``.
    """

    def __init__(self, device: torch.device, *,
                 mark: Callable[[], StepDone | None] | None = None,
                 free_bytes: Callable[[], int] = shm_free_bytes,
                 options: StagingOptions | None = None):
        super().__init__(options or staging_options(device))
        self._mark = mark or (lambda: mark_training_stream(device))
        self._free_bytes = free_bytes
        self._space_checked = False

    def stage(self, state_dict: dict[str, Any], **kwargs: Any) -> Any:
        if not self._space_checked:
            self._check_space(state_dict)
            self._space_checked = True
        return super().stage(state_dict, step_done=self._mark(), **kwargs)

    def _stage(self, state_dict: dict[str, Any], step_done: StepDone | None = None,
               **kwargs: Any) -> Any:
        if step_done is not None:  # in the staging thread: the step's kernels have finished
            step_done.synchronize()
        return super()._stage(state_dict, **kwargs)

    def _check_space(self, state_dict: dict[str, Any]) -> None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        need, free = state_bytes(state_dict) * local_ranks, self._free_bytes()
        if need > free:
            raise CheckpointError(
                f"async_with_pinned_mem stages the state in {SHM}: this node needs about "
                f"{need / 2**30:.2f} GiB ({local_ranks} rank(s) x {need / local_ranks / 2**30:.2f}"
                f" GiB) but {free / 2**30:.2f} GiB is free there. Enlarge {SHM} (e.g. docker "
                "--shm-size), or use [checkpoint] async_mode = \"async\" (no shared memory)")

