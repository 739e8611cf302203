"""The DeepSeek-V3 parallelization plan: one model part in, the same part parallelized out.

The steps and their order are llama3's (each lives in its own file under distributed/):
activation checkpointing -> FSDP2, each skipping the modules a pipeline stage dropped. Block
compile is refused at start-up for now (args.py ``validate``): llama3's full-graph block
compile does not trace the MoE layer's data-dependent token sort and load counting.
Expert parallelism slots in as one more step before AC (it shards ``moe.experts`` and wraps
its forward with the token all-to-alls), and its FSDP step then shards the expert weights over
their own mesh. The MoE balancing bias update is an optimizer step post-hook
(``register_optimizer_hooks``), not a module change.
"""

from __future__ import annotations

from torch import nn

from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.activation_checkpoint import apply_ac
from torchtitan_like.distributed.expert_layout import expert_fsdp_mesh
from torchtitan_like.distributed.expert_parallel import apply_expert_fsdp, apply_expert_parallel
from torchtitan_like.distributed.fsdp import apply_fsdp, reshard_after_forward
from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims
from torchtitan_like.distributed.utils import DTYPES
from torchtitan_like.models.deepseek_v3.model import DeepSeekV3Model
from torchtitan_like.models.moe import register_moe_balancing


def parallelize_deepseek_v3(
    model: DeepSeekV3Model, parallel_dims: ParallelDims, meshes: Meshes, config: JobConfig
) -> DeepSeekV3Model:
    if parallel_dims.ep_enabled:
        apply_expert_parallel(_routed_experts(model), meshes.expert["ep"])
    apply_ac(model.layers, config.activation_checkpoint)
    if parallel_dims.fsdp_enabled:
        _apply_fsdp(model, parallel_dims, meshes, config)
    return model


def _apply_fsdp(model: DeepSeekV3Model, parallel_dims: ParallelDims, meshes: Meshes,
                config: JobConfig) -> None:
    """One FSDP unit per block, the embedding, and norm + head (as llama3); under EP each
    experts module first gets its own unit over the expert-FSDP mesh."""
    blocks = [[block] for block in model.layers.values()]
    param_dtype = DTYPES[config.training.mixed_precision_param]
    reduce_dtype = DTYPES[config.training.mixed_precision_reduce]
    reshard = reshard_after_forward(config.parallelism.fsdp_reshard_after_forward,
                                    parallel_dims.pp > 1)
    ignored = set()
    if parallel_dims.ep_enabled:
        ignored = apply_expert_fsdp(_routed_experts(model), expert_fsdp_mesh(meshes.expert),
                                    param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                    reshard=reshard)
    apply_fsdp(
        model,
        meshes.fsdp,
        [[model.tok_embeddings], *blocks, [model.norm, model.output]],
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        reshard=reshard,
        ignored_params=ignored,
    )


def _routed_experts(model: DeepSeekV3Model) -> list[nn.Module]:
    """The GroupedExperts of this part's MoE blocks (expert parallelism shards these)."""
    return [block.moe.experts for block in model.layers.values() if block.moe_enabled]


def register_optimizer_hooks(model_parts: list[nn.Module], optimizers: OptimizersContainer,
                             parallel_dims: ParallelDims, meshes: Meshes) -> None:
    """The auxiliary-loss-free bias update after every optimizer step, from the token counts
    of all ranks that see different tokens of the step (data and context parallel)."""
    reduce_mesh = meshes.dp_cp if parallel_dims.dp * parallel_dims.cp > 1 else None
    register_moe_balancing(model_parts, optimizers, reduce_mesh)
