"""FSDP2 (``fully_shard``) and HSDP: shard parameters, gradients and optimizer states.

Each group of modules (a transformer block, the embedding, the norm + head) is one FSDP unit:
its parameters are all-gathered in one collective just before it runs and its gradients are
reduce-scattered in one collective right after its backward, so communication of unit i+1
overlaps the compute of unit i. Per rank, parameters + gradients + Adam states cost
(4 + 4 + 8) bytes x N / (dp_shard x cp) in fp32 instead of 16N (ZeRO-3). With a 2-D mesh
(dp_replicate, dp_shard_cp) parameters are sharded inside a group and replicated across groups
(HSDP): the reduce-scatter stays on the fast links and only 1/dp_shard of the gradients crosses
between replicas.

Gradients are *summed*, not averaged, across ranks: the loss is already divided by the number
of tokens in the global batch (protocols/loss.py), so the sum is the exact global gradient
under any data/context-parallel layout and any gradient accumulation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from torchtitan_like.distributed.tied_weights import tied_aliases


def reshard_after_forward(policy: str, pp_enabled: bool) -> bool:
    """``default`` frees gathered parameters after forward except under PP, where each
    microbatch's backward would otherwise gather them again."""
    if policy == "default":
        return not pp_enabled
    return policy == "always"


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    groups: Sequence[Sequence[nn.Module]],
    *,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard: bool,
    ignored_params: set[nn.Parameter] | None = None,
) -> None:
    """Shard each group of ``groups`` as one unit, then the root (whatever is left, except
    ``ignored_params``).

    The last group runs first in backward, so it is never resharded after forward. A parameter
    the model reaches under several names (a module shared by the trunk and an extra head,
    which may sit inside a group) belongs to the root unit, gathered for the whole forward and
    reduced once: a group's unit would gather it only around the group's own forward.
    """
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    shared = {model.get_parameter(name) for name in tied_aliases(model)}
    for i, group in enumerate(groups):
        modules = [m for m in group if m is not None]
        if modules:
            fully_shard(
                modules if len(modules) > 1 else modules[0],
                mesh=mesh,
                mp_policy=mp_policy,
                reshard_after_forward=reshard and i < len(groups) - 1,
                ignored_params=(ignored_params or set()) | shared,
            )
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard,
                ignored_params=ignored_params)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)

