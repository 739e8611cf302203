"""The DeepSeek-V3 parallelization plan: one model part in, the same part parallelized out.

The steps and their order are llama3's (each lives in its own file under distributed/, the
tail applied by distributed/plan_toolkit.py's ``apply_block_tail``): tensor parallel ->
expert parallelism -> activation checkpointing -> compile -> FSDP2, each skipping the modules
a pipeline stage dropped; the MoE blocks compile around their MoE layer, and under TP every
block around its local TP regions (distributed/compile.py). Expert parallelism shards
``moe.experts`` and wraps its forward with the token all-to-alls, and its FSDP step then
shards the expert weights over their own mesh. The MoE balancing bias update is an optimizer
step post-hook (``register_optimizer_hooks``), not a module change.

Tensor parallel: the embedding, final norm and head as llama's (vocabulary rows, sequence
parallel norm, loss parallel), the block norms sequence parallel, a dense block's SwiGLU
column/row-wise, and two local TP regions per block (distributed/local_tp.py), each with one
all-gather in and one reduce-scatter out:

- multi-head latent attention, split by heads: the up-projections ``wq`` (or ``wq_b``) and
  ``wkv_b`` column-wise, ``wo`` row-wise. The low-rank down-projections ``wq_a`` and ``wkv_a``
  and their norms are replicated: every head reads the whole latent, and ``wkv_a`` also makes
  the one decoupled RoPE key all heads share, so every rank rotates it whole (the same table,
  the same positions) and expands it to its own heads;
- the MoE layer: router replicated, every expert split by hidden features (local_tp.py);
  under ETP = 1 (expert parallelism borrowing the TP ranks) it runs instead on each rank's own
  sequence shard, its routed experts whole on their EP ranks.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.activation_checkpoint import apply_ac
from torchtitan_like.distributed.local_tp import LocalTensorParallel
from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims
from torchtitan_like.distributed.plan_toolkit import apply_block_tail
from torchtitan_like.distributed.tensor_parallel import BlockPlanFn, TPPlan, apply_tp
from torchtitan_like.distributed.tp_styles import nested
from torchtitan_like.models.block_plan import expert_options, prenorm_tp_plan
from torchtitan_like.models.deepseek_v3.model import DeepSeekV3Model
from torchtitan_like.models.moe import register_moe_balancing, routed_experts

if TYPE_CHECKING:
    from torchtitan_like.components.optimizer import OptimizersContainer

MLA_SHARDED = {"wq.weight": 0, "wq_b.weight": 0, "wkv_b.weight": 0, "wo.weight": 1}
"""MLA's per-head projections (heads are contiguous rows of wq/wq_b/wkv_b, columns of wo);
the rest (wq_a, q_norm, wkv_a, kv_norm) is replicated."""


def block_tp_plan(block: nn.Module, device_type: str, expert_parallel: bool = False,
                  experts_over_tp: bool = True) -> dict[str, ParallelStyle]:
    """The shared block's table (models/block_plan.py) with MLA as a local TP region: the
    dense SwiGLU pair or the MoE region (its routed experts left to expert parallelism when
    it is on; ``experts_over_tp=False``: ETP = 1, the MoE layer runs on each rank's sequence
    shard)."""
    present = {name for name, _ in block.attention.named_parameters()}
    attention = LocalTensorParallel({p: d for p, d in MLA_SHARDED.items() if p in present})
    return prenorm_tp_plan(block, device_type, {"attention": attention},
                           expert_parallel=expert_parallel, experts_over_tp=experts_over_tp)


def tp_plan(block_plan: BlockPlanFn) -> TPPlan:
    """What DeepSeek-V3 shards under TP: llama's edges (no tied head), the blocks, and the MTP
    depths; the MTP's embedding is the trunk's own module, split once, or on the last
    pipeline stage its copy of it, split alike."""
    return TPPlan(blocks={"layers": block_plan,
                          "mtp.depths": partial(mtp_tp_plan, block_plan=block_plan)},
                  embeddings=("tok_embeddings", "mtp.embedding"), norm="norm", head="output")


def parallelize_deepseek_v3(
    model: DeepSeekV3Model, parallel_dims: ParallelDims, meshes: Meshes, config: JobConfig
) -> DeepSeekV3Model:
    """TP -> EP -> AC -> FSDP (one unit per block, the embedding, and norm + head, as llama3;
    under EP each experts module first gets its own unit over the expert-FSDP mesh). The MTP
    depths (mtp.py) get the blocks' TP plan, EP and AC (wrapped before EP: EP changes the
    experts in place, so the order does not matter), and one FSDP unit each after the head.
    The embedding they share is in the root unit where the part holds it twice (FSDP: a
    shared module is gathered for the whole forward); the last pipeline stage's copy of it
    gets the embedding's TP style and lies in the root unit too, so both copies are sharded
    alike (distributed/tied_weights.py)."""
    block_plan = partial(block_tp_plan, **expert_options(parallel_dims))
    apply_tp(model, tp_plan(block_plan), parallel_dims, meshes, config)
    mtp = model.mtp.depths if model.mtp is not None else nn.ModuleDict()
    apply_ac(mtp, config.activation_checkpoint)  # the MTP depths, each as one block
    blocks = [*model.layers.values(), *(depth.block for depth in mtp.values())]
    apply_block_tail(model, model.layers, parallel_dims, meshes, config,
                     before=[[model.tok_embeddings if model.mtp is None else None]],
                     after=[[model.norm, model.output], *([depth] for depth in mtp.values())],
                     routed_experts=routed_experts(blocks))
    return model


def mtp_tp_plan(depth: nn.Module, device_type: str,
                block_plan: BlockPlanFn) -> dict[str, ParallelStyle]:
    """One MTP depth (mtp.py) on sequence-sharded hidden states: its norms and the
    token-wise projection sequence parallel (replicated weights, gradients summed over TP),
    its block as the model's blocks."""
    return {
        "enorm": SequenceParallel(), "hnorm": SequenceParallel(), "norm": SequenceParallel(),
        "eh_proj": SequenceParallel(use_local_output=True),
        **nested("block", block_plan(depth.block, device_type)),
    }


def register_optimizer_hooks(model_parts: list[nn.Module], optimizers: OptimizersContainer,
                             parallel_dims: ParallelDims, meshes: Meshes) -> None:
    """The auxiliary-loss-free bias update after every optimizer step, from the token counts
    of all ranks that see different tokens of the step (data and context parallel)."""
    reduce_mesh = meshes.dp_cp if parallel_dims.dp * parallel_dims.cp > 1 else None
    register_moe_balancing(model_parts, optimizers, reduce_mesh)
