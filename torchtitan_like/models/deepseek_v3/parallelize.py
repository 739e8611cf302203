"""The DeepSeek-V3 parallelization plan: one model part in, the same part parallelized out.

The steps and their order are llama3's (each lives in its own file under distributed/, the
tail applied by distributed/plan_toolkit.py's ``apply_block_tail``): expert parallelism ->
activation checkpointing -> compile -> FSDP2, each skipping the modules a pipeline stage
dropped; the MoE blocks compile around their MoE layer (distributed/compile.py).
Expert parallelism slots in as one more step before AC (it shards ``moe.experts`` and wraps
its forward with the token all-to-alls), and its FSDP step then shards the expert weights over
their own mesh. The MoE balancing bias update is an optimizer step post-hook
(``register_optimizer_hooks``), not a module change.
"""

from __future__ import annotations

from torch import nn

from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims
from torchtitan_like.distributed.plan_toolkit import apply_block_tail
from torchtitan_like.models.deepseek_v3.model import DeepSeekV3Model
from torchtitan_like.models.moe import register_moe_balancing, routed_experts


def parallelize_deepseek_v3(
    model: DeepSeekV3Model, parallel_dims: ParallelDims, meshes: Meshes, config: JobConfig
) -> DeepSeekV3Model:
    """EP -> AC -> FSDP (one unit per block, the embedding, and norm + head, as llama3; under
    EP each experts module first gets its own unit over the expert-FSDP mesh)."""
    apply_block_tail(model, model.layers, parallel_dims, meshes, config,
                     before=[[model.tok_embeddings]], after=[[model.norm, model.output]],
                     routed_experts=routed_experts(model.layers.values()))
    return model


def register_optimizer_hooks(model_parts: list[nn.Module], optimizers: OptimizersContainer,
                             parallel_dims: ParallelDims, meshes: Meshes) -> None:
    """The auxiliary-loss-free bias update after every optimizer step, from the token counts
    of all ranks that see different tokens of the step (data and context parallel)."""
    reduce_mesh = meshes.dp_cp if parallel_dims.dp * parallel_dims.cp > 1 else None
    register_moe_balancing(model_parts, optimizers, reduce_mesh)
