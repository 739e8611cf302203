"""Tensor parallel regions computed on plain local tensors: multi-head latent attention and
mixture-of-experts layers.

DTensor's styles (``ColwiseParallel`` ...) need a sharding rule for every op between them. A
MoE layer (a data-dependent token sort, grouped GEMMs over data-dependent groups, load
counting) and MLA (one low-rank latent and one RoPE key shared by all heads) mix sharded and
replicated parameters with ops DTensor has no rules for. ``LocalTensorParallel`` runs such a
module on plain tensors instead, with Megatron's communication around it, no more:

- in: the sequence-sharded hidden states are all-gathered (Shard(1) -> Replicate), so every TP
  rank sees every token;
- inside: each parameter is either *sharded* (rank r holds one slice: its attention heads, or
  its slice of every expert's hidden features) or *replicated* (every rank computes the same
  values with it: the router, the low-rank down-projections and their norms). The module's own
  forward runs on the local tensors, without communication;
- out: every rank's output is a partial sum (its heads through wo's rows, its hidden slice
  through w2's rows), reduce-scattered back to sequence shards (Partial -> Shard(1)).

Why it is exact. Write the region's output as ``y = sum_r y_r(x, theta)``, y_r rank r's partial
output. Backward receives the same dL/dy on every rank (the all-gather that undoes the
reduce-scatter), and by linearity ``dL/dx = sum_r dL/dy . dy_r/dx``, the same for a
replicated parameter: each rank's gradient is one term of the sum, so the input gradient is
reduce-scattered (summed, not sliced) and a replicated parameter's gradient is all-reduced over
TP. A sharded parameter's slice appears in its own rank's y_r only: its local gradient is
already complete. This needs every term of the output to pass through a sharded projection:
a replicated path straight to the output would be counted tp times (true of MLA and of the MoE
layer, whose routed and shared experts both end in row-wise w2; a loss term added inside the
region is refused for the same reason, see ``check_moe_tensor_parallel``).

The swap: before the module's forward, every parameter in ``module._parameters`` (recursively)
is replaced by its local view (``to_local()`` for a sharded one; for a replicated one a view
whose backward all-reduces), and put back after it. FSDP's unsharded parameters are DTensors on
the TP mesh, so the swap composes with FSDP, and with activation checkpointing (a recomputed
forward swaps again).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ParallelStyle


class LocalTensorParallel(ParallelStyle):
    """Run ``module`` on plain tensors inside one TP region (module docstring).

    ``sharded`` maps a parameter name (relative to ``module``) to the dim it is split along;
    every other parameter is replicated. The first positional input is the sequence-sharded
    hidden state (a Shard(1) DTensor or local tensor); other inputs pass through. The output
    is the local Shard(1) tensor.
    """

    def __init__(self, sharded: Mapping[str, int]):
        super().__init__()
        self.sharded = dict(sharded)

    def _distribute(self, prefix: str, owner: nn.Module, mesh: DeviceMesh) -> None:
        for leaf, param in list(owner.named_parameters(recurse=False)):
            name = f"{prefix}.{leaf}" if prefix else leaf
            placement: Placement = (Shard(self.sharded[name]) if name in self.sharded
                                    else Replicate())
            owner.register_parameter(leaf, nn.Parameter(
                distribute_tensor(param, mesh, [placement]), requires_grad=param.requires_grad))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        unknown = set(self.sharded) - {name for name, _ in module.named_parameters()}
        if unknown:
            raise ValueError(f"LocalTensorParallel: no parameter(s) {sorted(unknown)} in "
                             f"{type(module).__name__}")
        for prefix, owner in module.named_modules():
            self._distribute(prefix, owner, device_mesh)
        mesh = device_mesh
        module.register_forward_pre_hook(lambda m, args: _enter(m, args, mesh))
        module.register_forward_hook(lambda m, _args, out: _leave(m, out, mesh))
        return module


def _enter(module: nn.Module, args: tuple, mesh: DeviceMesh) -> tuple:
    """All-gather the sequence (its local gradient is a partial sum: reduce-scattered) and
    swap in the parameters' local views."""
    x, *rest = args
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
    full = x.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
    module._local_tp_saved = [(m, dict(m._parameters)) for m in module.modules()]
    for owner, params in module._local_tp_saved:
        for name, param in params.items():
            if isinstance(param, DTensor):
                owner._parameters[name] = _local_view(param)
    return (full, *rest)


def _leave(module: nn.Module, output: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Put the parameters back; reduce-scatter the partial sums to sequence shards."""
    for owner, params in module._local_tp_saved:
        owner._parameters.update(params)
    del module._local_tp_saved
    partial = DTensor.from_local(output, mesh, [Partial()], run_check=False)
    return partial.redistribute(mesh, [Shard(1)]).to_local()


def _local_view(param: DTensor) -> torch.Tensor:
    """The local tensor of a TP parameter; a replicated one's gradient is summed over TP."""
    if param.placements[0].is_replicate():
        return param.redistribute(param.device_mesh, [Replicate()]).to_local(
            grad_placements=[Partial()])
    return param.to_local()


MOE_SHARDED = {"experts.w1": 1, "experts.w3": 1, "experts.w2": 2,
               "shared_experts.w1.weight": 0, "shared_experts.w3.weight": 0,
               "shared_experts.w2.weight": 1}
"""A MoE layer (models/moe/) with its experts split over TP (ETP = TP): every expert's hidden
features, w1/w3 ([E, hidden, dim]) by rows and w2 ([E, dim, hidden]) by columns, and the shared
experts' SwiGLU the same way; the router's gate is replicated (every rank routes every token
identically, so the token sort and the load counts equal one process's)."""


def moe_tp_plan(block: nn.Module, name: str = "moe") -> dict[str, ParallelStyle]:
    """TP plan entry for the MoE layer ``block.<name>`` (experts split as ``MOE_SHARDED``)."""
    moe = block.get_submodule(name)
    present = {p for p, _ in moe.named_parameters()}
    return {name: LocalTensorParallel({p: d for p, d in MOE_SHARDED.items() if p in present})}
