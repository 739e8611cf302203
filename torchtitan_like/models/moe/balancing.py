"""DeepSeek-V3's auxiliary-loss-free load balancing: after every optimizer step, each MoE
layer's selection bias moves by ``coeff * sign(mean load - expert load)``, so overloaded
experts become less likely to be chosen and underloaded ones more.

The load is the token count of the whole data-parallel batch (all microbatches, all ranks of
``reduce_mesh``), so every rank applies the same update and the bias stays replicated, exactly
as in one process over the same global batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from torchtitan_like.models.moe.moe import MoE

if TYPE_CHECKING:
    from torchtitan_like.components.optimizer import OptimizersContainer


def bias_update(tokens_per_expert: torch.Tensor, coeff: float) -> torch.Tensor:
    """The step to add to the bias: +coeff for an expert below the mean load, -coeff above
    it, 0 exactly at it."""
    load = tokens_per_expert.float()
    return coeff * torch.sign(load.mean() - load)


@torch.no_grad()
def balance_experts(model: nn.Module, reduce_mesh: DeviceMesh | None) -> None:
    """Apply one bias update to every MoE layer of ``model`` from the tokens counted since the
    last one, summed over ``reduce_mesh`` (None = one process), then reset the counts."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        return
    counts = torch.stack([layer.tokens_per_expert for layer in layers])
    if reduce_mesh is not None and reduce_mesh.size() > 1:
        if reduce_mesh.ndim != 1:
            raise ValueError("balance_experts needs a 1-D data-parallel mesh (flatten it)")
        dist.all_reduce(counts, group=reduce_mesh.get_group())
    for layer, layer_counts in zip(layers, counts, strict=True):
        if layer.expert_bias is not None:
            layer.expert_bias.add_(bias_update(layer_counts, layer.args.load_balance_coeff))
        layer.tokens_per_expert.zero_()


def register_moe_balancing(model_parts: list[nn.Module], optimizers: OptimizersContainer,
                           reduce_mesh: DeviceMesh | None) -> None:
    """Run ``balance_experts`` on each model part right after its optimizer steps.
    ``reduce_mesh`` is the data-parallel mesh whose ranks see different tokens of the same
    step (None = one process)."""
    for optimizer, part in zip(optimizers.optimizers, model_parts, strict=True):
        optimizer.register_step_post_hook(
            lambda _opt, _args, _kwargs, m=part: balance_experts(m, reduce_mesh)
        )
