"""Whether a layout can run: the trainer's own rules (distributed/layout_rules.py) applied to
the planner's inputs, plus what only a cluster decides (the GPU count, TP within a node)."""

from __future__ import annotations

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed import layout_rules as rules
from torchtitan_like.distributed.expert_layout import validate_expert_layout
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.pipeline import is_single_stage
from torchtitan_like.tools.planner.inputs import (
    Cluster,
    Layout,
    LayoutError,
    ModelShape,
    Workload,
    check_ac,
)
from torchtitan_like.tools.planner.moe import expert_tensor_parallel


def validate_layout(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout) -> int:
    """Raise LayoutError if the layout cannot run; return the microbatches per step per rank."""
    check_ac(layout.ac)
    if layout.num_gpus != cluster.num_gpus:
        raise LayoutError(f"{layout.label()} uses {layout.num_gpus} GPUs, the cluster has "
                          f"{cluster.num_gpus}")
    if layout.tp > cluster.gpus_per_node:
        raise LayoutError(f"tp {layout.tp} spans more than a node ({cluster.gpus_per_node} GPUs)")
    if layout.async_tp and not (layout.compile and layout.tp > 1):
        raise LayoutError("async TP needs tp > 1 and compiled blocks")
    if layout.op_sac_every_other_matmul and (layout.ac != "op" or m.is_moe):
        raise LayoutError("op_sac_every_other_matmul prices TorchTitan's op-level AC policy on "
                          "a dense block: it needs ac op and a model without experts")
    if layout.cp_rotate_method not in ("allgather", "alltoall"):
        raise LayoutError(f"cp_rotate_method {layout.cp_rotate_method!r}: use allgather or "
                          "alltoall")
    if layout.cp_algorithm not in ("ring", "gathered_kv"):
        raise LayoutError(f"cp_algorithm {layout.cp_algorithm!r}: use ring or gathered_kv")
    if layout.cp_algorithm == "gathered_kv" and layout.cp == 1:
        raise LayoutError("cp_algorithm gathered_kv prices Llama 3's all-gather CP: it needs "
                          "cp > 1")
    if layout.ep_overlapped and not (layout.ep > 1 and layout.pp > 1):
        raise LayoutError("ep_overlapped prices a pipeline schedule hiding the EP all-to-all: "
                          "it needs ep > 1 and pp > 1")
    try:
        return _trainer_rules(m, work, layout)
    except ConfigError as e:
        raise LayoutError(str(e)) from None


def _trainer_rules(m: ModelShape, work: Workload, layout: Layout) -> int:
    """The checks the trainer runs at start-up, in its order; the microbatches per step."""
    t, mb = layout.tp, layout.local_batch_size
    rules.accumulation_steps(work.global_batch, mb, layout.dp)
    rules.check_sequence_parallel(t, work.seq_len)
    rules.check_context_parallel(layout.cp, t, work.seq_len, layout.cp_load_balancer)
    rules.check_attention_mask(layout.cp, work.attn_mask_type)
    per_schedule = 1
    if layout.pp > 1:
        v = layout.stages_per_rank
        rules.check_stages_per_rank(layout.pp_schedule, v, is_single_stage(layout.pp_schedule))
        per_schedule = layout.pp_microbatches or work.global_batch // (mb * layout.dp)
        rules.check_microbatches(layout.pp, v, layout.pp_schedule, per_schedule * mb, mb)
    steps = rules.accumulation_steps(work.global_batch, per_schedule * mb, layout.dp)
    rules.check_tensor_parallel_shapes(t, m.n_heads, m.kv_heads, m.vocab_size, "the model")
    if layout.pp > 1:
        rules.check_stage_count(m.n_layers, layout.pp * layout.stages_per_rank)
    dims = ParallelDims(pp=layout.pp, dp_replicate=layout.dp_replicate, dp_shard=layout.dp_shard,
                        cp=layout.cp, tp=t, world_size=layout.num_gpus, ep=layout.ep,
                        etp=expert_tensor_parallel(t, layout.ep) if m.num_experts else 1)
    validate_expert_layout(dims, m.num_experts)
    if m.num_experts:
        rules.check_moe_tensor_parallel(t, float8=layout.float8, where="the model")
    if getattr(m.args, "mtp_depth", 0):  # DeepSeek-V3's multi-token prediction
        rules.check_multi_token_prediction(layout.cp, layout.compile, "the model")
    return steps * per_schedule
