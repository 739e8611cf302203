"""The runtime of pipeline parallelism: this rank's stages and torch's schedule that runs them
(the split, the schedules' math and their rules are in pipeline.py).

A module of its own because importing ``torch.distributed.pipelining`` imports ``torch._dynamo``
(and inductor with it): 0.3 s of every process's start on a CPU, which a job without PP never
needs. ``pipeline.build_pipeline`` imports it only when it builds one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

from torchtitan_like.logging import logger


class _Stage(PipelineStage):
    """A PipelineStage that also runs forward-only (validation) under V-shaped schedules, and
    runs each microbatch's forward inside ``forward_context``.

    torch 2.13's runtime schedules walk their backward actions in ``eval()`` too (the stage
    skips the computation); with two adjacent stages on one rank (V placement) the schedule then
    hands the never-computed input gradient from one to the other and fails. Without backward
    there is nothing to hand over.

    ``forward_context`` marks the forwards of real microbatches: the stage's first step also
    runs a metadata-inference forward on uninitialised tensors, which the model's metric hooks
    (protocols/step_hooks.py) must not record.
    """

    forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def forward_one_chunk(self, *args, **kwargs):
        with self.forward_context():
            return super().forward_one_chunk(*args, **kwargs)

    def get_local_bwd_output(self, mb_index: int):
        return super().get_local_bwd_output(mb_index) if self.has_backward else ()

    def set_local_bwd_input(self, next_stage_bwd_outputs, mb_index: int) -> None:
        if self.has_backward:
            super().set_local_bwd_input(next_stage_bwd_outputs, mb_index)


class Pipeline:
    """This rank's stages and the schedule that runs them.

    ``forward_backward`` runs one schedule step on a local batch; the loss of every microbatch
    is ``loss_fn(logits, labels) / global_tokens`` on the last stage, so their sum is this
    rank's share of the step's global mean loss (zero on ranks without the last stage).
    """

    def __init__(
        self,
        model_parts: list[nn.Module],
        stage_ids: list[int],
        n_stages: int,
        schedule: str,
        n_microbatches: int,
        pp_mesh: DeviceMesh,
        device: torch.device,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ):
        self.stages = stages = [
            _Stage(part, stage, n_stages, device, group=pp_mesh.get_group())
            for part, stage in zip(model_parts, stage_ids, strict=True)
        ]
        for stage in stages:
            stage.forward_context = forward_context
        schedule_cls = get_schedule_class(schedule)
        self.schedule = schedule_cls(
            stages[0] if issubclass(schedule_cls, PipelineScheduleSingle) else stages,
            n_microbatches=n_microbatches,
            loss_fn=self._scaled_loss,
            scale_grads=False,
        )
        self.loss_fn = loss_fn
        self.has_first = 0 in stage_ids
        self.has_last = n_stages - 1 in stage_ids
        self.device = device
        self.normaliser = torch.ones((), device=device)
        logger.info(f"pipeline: stages {stage_ids} of {n_stages} on this rank, {schedule} "
                    f"schedule, {n_microbatches} microbatches per step")

    def receive_buffers(self) -> list[torch.Tensor]:
        """The tensors this rank's stages receive activations and gradients into: one per
        microbatch each (torch allocates them at the first step and keeps them), for memory
        accounting (components/memory.py)."""
        return [info.buffer for stage in self.stages
                for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values())
                for info in infos if info.buffer is not None]

    def _scaled_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(logits, labels) / self.normaliser

    def _run(self, step: Callable, inputs: torch.Tensor, labels: torch.Tensor, /,
             **kwargs) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        step(*([inputs] if self.has_first else []),
             target=labels if self.has_last else None, losses=losses, **kwargs)
        if not self.has_last:
            return torch.zeros((), device=self.device)
        return torch.stack(losses).sum().detach()

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor,
                         global_tokens: torch.Tensor, /, **model_kwargs: torch.Tensor
                         ) -> torch.Tensor:
        """One schedule step; returns sum(cross-entropy) / global_tokens on the last stage.
        ``model_kwargs`` (batch-first tensors: models/stage_inputs.py, e.g. document ids or
        the labels themselves) are cut into the same microbatches as the inputs and reach the
        forward of every stage, first or not."""
        self.normaliser = global_tokens
        return self._run(self.schedule.step, inputs, labels, return_outputs=False,
                         **model_kwargs)

    def loss_sum(self, inputs: torch.Tensor, labels: torch.Tensor, /,
                 **model_kwargs: torch.Tensor) -> torch.Tensor:
        """Forward only (validation); the summed cross-entropy on the last stage, else 0."""
        self.normaliser = torch.ones((), device=self.device)
        return self._run(self.schedule.eval, inputs, labels, **model_kwargs)
