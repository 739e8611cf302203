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
layer, whose routed and shared experts both end in row-wise w2). A loss term added inside the
region (the MoE auxiliary balance loss, through step hooks) is such a replicated path: every
rank computes all of it, so each adds 1/tp of its gradient (``StepHooks.share_loss_gradients``,
protocols/step_hooks.py, where the exactness is derived).

The swap: before the module's forward, each of the region's parameters is replaced in its
owner's ``_parameters`` by its local view (``to_local()`` for a sharded one; for a replicated
one a view whose backward all-reduces), and put back after it. Parameters another style owns
(routed experts under expert parallelism) are left alone. FSDP's unsharded parameters are
DTensors on the TP mesh, so the swap composes with FSDP, and with activation checkpointing (a
recomputed forward swaps again).

Sequence-local regions (``gather_sequence=False``): a MoE layer whose routed experts are not
split over TP (ETP = 1: expert parallelism borrowed the TP ranks) runs on this rank's own
sequence shard, no all-gather in, no reduce-scatter out. Every parameter of the region is
replicated: each rank routes its own tokens with the whole gate, sends them to their experts
over the ``ep`` group (which spans TP ranks) and gets their outputs back, and runs the shared
experts whole on them. The output is then complete for the rank's tokens (no partial sums),
so is the input gradient; a replicated parameter's gradient is the sum over tokens, split over
the TP ranks by their shards: all-reduced over TP, like a sequence-parallel norm's.
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

from torchtitan_like.distributed.expert_parallel import EXPERT_HIDDEN_DIMS


class LocalTensorParallel(ParallelStyle):
    """Run ``module`` on plain tensors inside one TP region (module docstring).

    ``sharded`` maps a parameter name (relative to ``module``) to the dim it is split along;
    every other parameter is replicated. The first positional input is the sequence-sharded
    hidden state (a Shard(1) DTensor or local tensor); other inputs pass through. The output
    is the local Shard(1) tensor. ``gather_sequence=False``: a sequence-local region (module
    docstring), computed on the rank's own shard.
    """

    def __init__(self, sharded: Mapping[str, int], elsewhere: tuple[str, ...] = (),
                 gather_sequence: bool = True):
        super().__init__()
        self.sharded = dict(sharded)
        self.elsewhere = elsewhere
        self.gather_sequence = gather_sequence

    def _owned(self, module: nn.Module) -> list[tuple[nn.Module, str, str]]:
        """(owner module, parameter name in it, name in ``module``) of every parameter of the
        region, but those under an ``elsewhere`` prefix (e.g. routed experts that expert
        parallelism shards on its own mesh)."""
        return [(owner, leaf, f"{prefix}.{leaf}" if prefix else leaf)
                for prefix, owner in module.named_modules()
                if not any(f"{prefix}.".startswith(f"{skip}.") for skip in self.elsewhere)
                for leaf, _ in owner.named_parameters(recurse=False)]

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        owned = self._owned(module)
        unknown = set(self.sharded) - {name for _, _, name in owned}
        if unknown:
            raise ValueError(f"LocalTensorParallel: no parameter(s) {sorted(unknown)} in "
                             f"{type(module).__name__}")
        for owner, leaf, name in owned:
            param = owner.get_parameter(leaf)
            placement: Placement = (Shard(self.sharded[name]) if name in self.sharded
                                    else Replicate())
            owner.register_parameter(leaf, nn.Parameter(
                distribute_tensor(param, device_mesh, [placement]),
                requires_grad=param.requires_grad))
        slots = [(owner, leaf) for owner, leaf, _ in owned]
        gather = self.gather_sequence
        module.register_forward_pre_hook(
            lambda m, args: _enter(m, args, device_mesh, slots, gather))
        module.register_forward_hook(lambda m, _args, out: _leave(m, out, device_mesh, gather))
        module._local_tp_region = True
        return module


def is_local_tp_region(module: nn.Module) -> bool:
    """Whether ``module`` runs as a LocalTensorParallel region: per-block compile compiles its
    forward but leaves its hooks (collectives, parameter swap) eager (distributed/compile.py)."""
    return getattr(module, "_local_tp_region", False)


def _enter(module: nn.Module, args: tuple, mesh: DeviceMesh,
           slots: list[tuple[nn.Module, str]], gather: bool) -> tuple:
    """All-gather the sequence (its local gradient is a partial sum: reduce-scattered), or
    take the local shard, and swap in the local views of the region's parameters (``slots``:
    owner, name)."""
    x, *rest = args
    if gather:
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
        full = x.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
    else:
        full = x.to_local() if isinstance(x, DTensor) else x
    module._local_tp_saved = [(owner, leaf, owner._parameters[leaf]) for owner, leaf in slots]
    for owner, leaf, param in module._local_tp_saved:
        owner._parameters[leaf] = _local_view(param)
    # a loss term is computed alike on every rank of a gathered region; in a sequence-local
    # one each rank's term comes from its own tokens (no copies), and its sequences are split
    _share_loss_gradients(module, mesh.size() if gather else 1)
    if not gather:
        _split_sequences(module, mesh, split=True)
    return (full, *rest)


def _leave(module: nn.Module, output: torch.Tensor, mesh: DeviceMesh,
           gather: bool) -> torch.Tensor:
    """Put the parameters back; reduce-scatter the partial sums to sequence shards (a
    sequence-local region's output is already this rank's shard, complete)."""
    for owner, leaf, param in module._local_tp_saved:
        owner._parameters[leaf] = param
    del module._local_tp_saved
    _share_loss_gradients(module, 1)
    if not gather:
        _split_sequences(module, mesh, split=False)
        return output
    partial = DTensor.from_local(output, mesh, [Partial()], run_check=False)
    return partial.redistribute(mesh, [Shard(1)]).to_local()


def _share_loss_gradients(module: nn.Module, copies: int) -> None:
    """Loss terms the region's modules add through their step hooks are computed alike on
    ``copies`` ranks (module docstring): each rank adds 1/copies of their gradient."""
    for sub in module.modules():
        hooks = vars(sub).get("step_hooks")
        if hooks is not None:
            hooks.share_loss_gradients(copies)


def _split_sequences(module: nn.Module, mesh: DeviceMesh, split: bool) -> None:
    """In a sequence-local region each rank holds 1/tp of every sequence: the region's step
    hooks sum whole-sequence statistics over the TP ranks too (``StepHooks.sequence_sum``)."""
    hooks = {id(h): h for sub in module.modules() if (h := vars(sub).get("step_hooks"))}
    for each in hooks.values():  # one trainer's hooks, however many modules hold them
        if split:
            each.split_sequences(mesh, reduced=False)  # downstream sums cover dp/cp/pp
        else:
            each.unsplit_sequences(mesh)


def _local_view(param: DTensor) -> torch.Tensor:
    """The local tensor of a TP parameter; a replicated one's gradient is summed over TP."""
    if param.placements[0].is_replicate():
        return param.redistribute(param.device_mesh, [Replicate()]).to_local(
            grad_placements=[Partial()])
    return param.to_local()


MOE_SHARDED = {**{f"experts.{w}": dim for w, dim in EXPERT_HIDDEN_DIMS.items()},
               "shared_experts.w1.weight": 0, "shared_experts.w3.weight": 0,
               "shared_experts.w2.weight": 1}
"""A MoE layer (models/moe/) with its experts split over TP (ETP = TP): every expert's hidden
features, w1/w3 ([E, hidden, dim]) by rows and w2 ([E, dim, hidden]) by columns, and the shared
experts' SwiGLU the same way; the router's gate is replicated (every rank routes every token
identically, so the token sort and the load counts equal one process's)."""


def moe_tp_plan(block: nn.Module, name: str = "moe", expert_parallel: bool = False,
                experts_over_tp: bool = True) -> dict[str, ParallelStyle]:
    """TP plan entry for the MoE layer ``block.<name>`` (experts split as ``MOE_SHARDED``).
    Under expert parallelism the routed experts are left to it: it splits them over its
    ``(ep, etp)`` mesh (distributed/expert_parallel.py) and they still compute inside this
    region, each TP rank its hidden slice.

    ``experts_over_tp=False`` (ETP = 1, EP borrowing the TP ranks): a sequence-local region
    (module docstring), every parameter but the routed experts replicated; its step hooks sum
    the layer's token counts over TP (``StepHooks.sum_unreduced_splits``), so the balancing
    bias and the load metrics count the TP group's tokens, as one process does."""
    moe = block.get_submodule(name)
    elsewhere = ("experts",) if expert_parallel else ()
    if not experts_over_tp:
        return {name: LocalTensorParallel({}, elsewhere, gather_sequence=False)}
    present = {p for p, _ in moe.named_parameters()
               if not (expert_parallel and p.startswith("experts."))}
    return {name: LocalTensorParallel({p: d for p, d in MOE_SHARDED.items() if p in present},
                                      elsewhere)}
