"""The Qwen3 parallelization plan: llama's (models/llama3/parallelize.py), in llama's order
(TP -> CP -> AC -> compile -> FSDP), with two Qwen3 entries in each block's TP plan.

The q/k RMSNorms normalise each head over its own ``head_dim`` values. Tensor parallelism
splits the heads, never a head, so each rank normalises its own heads exactly as one process
does; only the norm weights' gradients need all ranks: every rank's heads contribute to them.
``SequenceParallel(sequence_dim=2)`` says precisely that: the input is sharded on dim 2 (the
heads of (bs, seq, heads, head_dim)), the weight is a replicated DTensor whose gradient is
summed over the TP ranks. Under TP a MoE layer all-gathers the sequence, routes every token on
every rank and computes its slice of every expert (distributed/local_tp.py; with ETP = 1 it
routes each rank's own sequence shard instead, EP borrowing the TP ranks); FSDP shards MoE
blocks as any block, and expert parallelism shards their routed experts (the shared tail of
distributed/plan_toolkit.py, as for deepseek_v3). With no selection bias in
Qwen3-MoE there is no optimizer hook to register.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims
from torchtitan_like.distributed.tp_styles import attention_plan
from torchtitan_like.models.block_plan import expert_options, prenorm_tp_plan
from torchtitan_like.models.llama3.parallelize import parallelize_llama
from torchtitan_like.models.moe import routed_experts
from torchtitan_like.models.qwen3.model import Qwen3Model


def qwen3_block_tp_plan(block: nn.Module, device_type: str, expert_parallel: bool = False,
                        experts_over_tp: bool = True) -> dict[str, ParallelStyle]:
    """Llama's attention entries plus head-sharded q/k norms (local tensors out, as RoPE
    expects), in the shared block's table (models/block_plan.py): a MoE block's ``moe`` runs
    as one local TP region with its experts split over TP where llama's block has its SwiGLU
    pair (on each rank's own sequence shard instead under ETP = 1,
    ``experts_over_tp=False``)."""
    attention = {
        **attention_plan(block, device_type),
        "attention.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
        "attention.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
    }
    return prenorm_tp_plan(block, device_type, attention, expert_parallel=expert_parallel,
                           experts_over_tp=experts_over_tp)


def parallelize_qwen3(model: Qwen3Model, parallel_dims: ParallelDims, meshes: Meshes,
                      config: JobConfig) -> Qwen3Model:
    return parallelize_llama(model, parallel_dims, meshes, config,
                             block_plan=partial(qwen3_block_tp_plan,
                                                **expert_options(parallel_dims)),
                             routed_experts=routed_experts(model.layers.values()))
