"""The planner's inputs read from a training config, with the trainer's own rules: its
``ParallelDims``, global-batch default, dtype table, stage count per rank and AC names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchtitan_like.components.optimizer import FUSED, optimizer_spec
from torchtitan_like.config.derived import float8_enabled, optimizer_state_dtype
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.distributed import layout_rules
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.pipeline import stages_per_rank
from torchtitan_like.tools.planner.inputs import (
    GPU,
    Cluster,
    Layout,
    LayoutError,
    ModelShape,
    Precision,
    Workload,
)
from torchtitan_like.tools.planner.memory import Memory, stage_memory
from torchtitan_like.tools.planner.rules import validate_layout

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig


def ac_of(config: JobConfig) -> str:
    """The planner's name for ``[activation_checkpoint]``: none, full, op or N."""
    ac = config.activation_checkpoint
    return ac.selective_ac_option if ac.mode == "selective" else ac.mode


def predict_peak(config: JobConfig, num_gpus: int, gpu: GPU) -> Memory:
    """The planner's peak memory per rank for a job config (all ranks on one node): that of
    the fullest pipeline rank."""
    return max(predict_stage_peaks(config, num_gpus, gpu), key=lambda mem: mem.total)


def predict_stage_peaks(config: JobConfig, num_gpus: int, gpu: GPU) -> list[Memory]:
    """The planner's peak memory of each pipeline rank for a job config (one entry without
    PP); global rank r is on pipeline rank r // (num_gpus / pp)."""
    model, work, layout = from_job_config(config, num_gpus)
    microbatches = validate_layout(model, Cluster(gpu, gpus_per_node=num_gpus), work, layout)
    return [stage_memory(model, gpu, work, layout, s, microbatches) for s in range(layout.pp)]


def _precision(config: JobConfig) -> Precision:
    t = config.training
    bf16_moments = optimizer_state_dtype(config.optimizer) == "bfloat16"
    foreach = config.optimizer.implementation == "foreach" and not bf16_moments
    return Precision(master_bytes=DTYPES[t.dtype].itemsize, state_bytes=2 if bf16_moments else 0,
                     step_temporary=foreach,
                     fused_optimizer=config.optimizer.implementation in FUSED,
                     compute_bytes=DTYPES[t.mixed_precision_param].itemsize,
                     reduce_bytes=DTYPES[t.mixed_precision_reduce].itemsize)


def implied_num_gpus(config: JobConfig) -> int | None:
    """The GPUs a config's degrees multiply to (replica groups included), or None when
    ``data_parallel_shard_degree = -1`` leaves the number to the launcher."""
    p, ft = config.parallelism, config.fault_tolerance
    if p.data_parallel_shard_degree == -1:
        return None
    return (p.pipeline_parallel_degree * p.data_parallel_replicate_degree
            * p.data_parallel_shard_degree * p.context_parallel_degree
            * p.tensor_parallel_degree * (ft.group_size if ft.enable else 1))


def replica_groups(config: JobConfig, num_gpus: int) -> tuple[int, int]:
    """(groups, GPUs per group) of a job on ``num_gpus`` GPUs in all: under
    ``[fault_tolerance] enable`` the replica groups are the job's dp_replicate dimension
    (distributed/fault_tolerance.py: each group its own torchrun job with dp_replicate = 1
    inside), so ``group_size`` groups of ``num_gpus / group_size`` GPUs; else one group."""
    ft = config.fault_tolerance
    groups = ft.group_size if ft.enable else 1
    if num_gpus % groups:
        raise LayoutError(f"--num_gpus {num_gpus} is not a multiple of [fault_tolerance] "
                          f"group_size = {groups} (the replica groups share the GPUs equally)")
    return groups, num_gpus // groups


def from_job_config(config: JobConfig, num_gpus: int) -> tuple[ModelShape, Workload, Layout]:
    """Model, workload and layout of a job config run on ``num_gpus`` GPUs (in all: replica
    groups included, as the planner's dp_replicate, whose ranks shard and hold the same)."""
    from torchtitan_like.models.registry import model_spec_and_args

    _, args = model_spec_and_args(config)
    t, p = config.training, config.parallelism
    groups, per_group = replica_groups(config, num_gpus)
    dims = ParallelDims.from_config(config, per_group)
    pipelined = dims.pp > 1
    microbatch = p.pipeline_parallel_microbatch_size if pipelined else t.local_batch_size
    if pipelined:  # the layout keeps microbatches per schedule, not the local batch: check it
        layout_rules.check_microbatches(dims.pp, stages_per_rank(p), p.pipeline_parallel_schedule,
                                        t.local_batch_size, microbatch)
    reshard = {"default": None, "always": True, "never": False}[p.fsdp_reshard_after_forward]
    compiled = config.compile.compiles_blocks
    layout = Layout(dp_replicate=dims.dp_replicate * groups, dp_shard=dims.dp_shard, cp=dims.cp,
                    tp=dims.tp, pp=dims.pp, local_batch_size=microbatch, ac=ac_of(config),
                    pp_schedule=p.pipeline_parallel_schedule,
                    pp_virtual_stages=stages_per_rank(p),
                    pp_microbatches=t.local_batch_size // max(1, microbatch) if pipelined else 0,
                    pp_embedding_weight=p.pipeline_parallel_embedding_weight,
                    pp_output_weight=p.pipeline_parallel_output_weight,
                    loss_parallel=not p.disable_loss_parallel,
                    reshard_after_forward=reshard,
                    cp_load_balancer=p.context_parallel_load_balancer,
                    cp_rotate_method=p.context_parallel_rotate_method,
                    compile=compiled, float8=float8_enabled(config),
                    async_tp=p.enable_async_tensor_parallel, ep=dims.ep)
    workload = Workload(seq_len=t.seq_len, precision=_precision(config),
                        optimizer=optimizer_spec(config).footprint(config),
                        attn_mask_type=config.model.attn_mask_type,
                        global_batch=layout_rules.global_batch(t.global_batch_size,
                                                               t.local_batch_size,
                                                               dims.dp * groups))
    return ModelShape.from_args(args), workload, layout
