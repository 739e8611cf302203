"""One layout, planned: its memory per GPU, communication, step time, throughput and cost.

Cost: GPU-hours = tokens x flops_per_token / (peak x MFU), with the given MFU or the step-time
model's estimate; the 6ND figure beside it counts 6 FLOPs per parameter per token (per active
parameter for an MoE model)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchtitan_like.tools.planner.calibration import CALIBRATION, Calibration
from torchtitan_like.tools.planner.communication import communication
from torchtitan_like.tools.planner.inputs import Cluster, GiB, Layout, ModelShape, Workload
from torchtitan_like.tools.planner.links import Comm
from torchtitan_like.tools.planner.memory import Memory, stage_memory
from torchtitan_like.tools.planner.rules import validate_layout
from torchtitan_like.tools.planner.schedule import (
    bubble_fraction,
    in_flight_peak,
    stage_split,
)
from torchtitan_like.tools.planner.step_time import StepTime, estimate_step_time


@dataclasses.dataclass
class Plan:
    layout: Layout
    memory: Memory
    """The peak of the fullest pipeline rank."""
    stage_totals: list[float]
    """Peak bytes of each pipeline rank (one entry without PP)."""
    capacity_gib: float
    usable_gib: float
    comms: list[Comm]
    microbatches: int
    bubble: float
    flops_per_token: int
    seq_len: int
    tokens_per_step: int
    step: StepTime
    tokens_per_second_per_gpu: float
    mfu_estimate: float
    mfu: float
    """The MFU time and cost use: the given one, else the estimate."""
    gpu_hours: float
    gpu_hours_6nd: float
    days: float
    notes: list[str]
    calibration: Calibration = CALIBRATION
    """The fitted numbers it was planned with."""

    @property
    def reserved_estimate(self) -> float:
        """Bytes the CUDA caching allocator likely reserves at the peak: the live peak x the
        calibrated ``allocator_reserve``."""
        return self.memory.total * self.calibration.allocator_reserve

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.usable_gib * GiB

    @property
    def step_seconds(self) -> float:
        return self.step.total

    def to_dict(self) -> dict[str, Any]:
        m = self.memory
        return {
            "layout": dataclasses.asdict(self.layout),
            "memory_gib": {"parameters": m.parameters / GiB, "gradients": m.gradients / GiB,
                           "optimizer": m.optimizer / GiB, "activations": m.activations / GiB,
                           "total": m.total / GiB, "peak_moment": m.moment, "stage": m.stage,
                           "reserved_estimate": self.reserved_estimate / GiB,
                           "per_pipeline_rank": [total / GiB for total in self.stage_totals]},
            "capacity_gib": self.capacity_gib,
            "usable_gib": self.usable_gib,
            "fits": self.fits,
            "communication": [{**dataclasses.asdict(c), "seconds": c.seconds}
                              for c in self.comms],
            "microbatches": self.microbatches,
            "bubble_fraction": self.bubble,
            "flops_per_token": self.flops_per_token,
            "tokens_per_step": self.tokens_per_step,
            "step_seconds": self.step_seconds,
            "step_breakdown_seconds": self.step.parts(),
            "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
            "mfu_estimate": self.mfu_estimate,
            "mfu": self.mfu,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_6nd": self.gpu_hours_6nd,
            "days": self.days,
            "notes": self.notes,
        }


def _notes(layout: Layout, microbatches: int) -> list[str]:
    notes = []
    if layout.pp > 1:
        held = in_flight_peak(layout, 0, layout.pp_microbatches or microbatches)
        notes.append(f"pipeline rank 0 holds up to {sum(held)} microbatch(es) in flight"
                     + (f" over its {len(held)} stages" if len(held) > 1 else ""))
        if layout.fsdp_enabled:
            notes.append("under PP, FSDP accumulates unsharded gradients in the reduce dtype "
                         "until the last microbatch")
    return notes


def plan(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout, *,
         mfu: float | None = None, headroom: float = 0.10,
         calibration: Calibration = CALIBRATION) -> Plan:
    """Memory, communication, time and cost of ``layout``; LayoutError if it cannot run."""
    microbatches = validate_layout(m, cluster, work, layout)
    gpu = cluster.gpu
    stages = [stage_memory(m, gpu, work, layout, s, microbatches) for s in range(layout.pp)]
    comms = communication(m, cluster, work, layout, microbatches)
    step = estimate_step_time(m, cluster, work, layout, microbatches, comms, calibration)
    fpt = m.flops_per_token(work.seq_len)
    tokens_per_step = work.global_batch * work.seq_len
    per_gpu = tokens_per_step / step.total / cluster.num_gpus
    peak = gpu.peak_tflops * 1e12
    mfu_estimate = per_gpu * fpt / peak
    used = mfu if mfu is not None else mfu_estimate
    gpu_hours = work.tokens * fpt / (peak * used) / 3600
    return Plan(
        layout=layout,
        memory=max(stages, key=lambda mem: mem.total),
        stage_totals=[mem.total for mem in stages],
        capacity_gib=gpu.memory_gib,
        usable_gib=gpu.memory_gib * (1 - headroom),
        comms=comms,
        microbatches=microbatches,
        bubble=bubble_fraction(layout.pp, microbatches, layout.modelled_schedule,
                               layout.stages_per_rank),
        flops_per_token=fpt,
        seq_len=work.seq_len,
        tokens_per_step=tokens_per_step,
        step=step,
        tokens_per_second_per_gpu=per_gpu,
        mfu_estimate=mfu_estimate,
        mfu=used,
        gpu_hours=gpu_hours,
        gpu_hours_6nd=6 * m.params_6nd * work.tokens / (peak * used) / 3600,
        days=gpu_hours / cluster.num_gpus / 24,
        notes=_notes(layout, microbatches),
        calibration=calibration,
    )


def ac_candidates(m: ModelShape, layers_per_stage: int) -> list[str]:
    """Checkpointing choices from the least recomputation to the most."""
    every = [str(n) for n in (8, 4, 3, 2) if n < layers_per_stage]
    return ["none", "op", *every, "full"]


def plan_fitting(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout,
                 **kwargs: Any) -> Plan:
    """``layout`` with ``ac = "auto"`` resolved to the least recomputation that fits (the last
    choice, full, when nothing fits)."""
    if layout.ac != "auto":
        return plan(m, cluster, work, layout, **kwargs)
    layers = max(stage_split(m.n_layers, layout))
    result = None
    for ac in ac_candidates(m, layers):
        result = plan(m, cluster, work, dataclasses.replace(layout, ac=ac), **kwargs)
        if result.fits:
            break
    assert result is not None
    return result
