"""Expert parallelism: each rank of the ``ep`` mesh holds E / ep routed experts and receives,
through an all-to-all, every token routed to them.

The experts module (``GroupedExperts``: stacked weights ``[E, ...]``, ``forward(x,
num_tokens_per_expert)`` with ``x`` sorted by expert) is left as written. ``ExpertParallel``
shards its weights along the expert dim (``Shard(0)`` over ``ep``; the module takes the local
block with ``to_local()``) and wraps its forward:

1. dispatch: the per-expert counts go first (an even all-to-all of ``E`` integers), so each rank
   knows how many tokens it sends to and receives from every other rank; then the tokens, one
   all-to-all with uneven splits. Rank ``r`` receives, from each source rank in turn, the tokens
   of its experts in expert order: ``[src 0: e0 e1 ..][src 1: e0 e1 ..]``; a stable sort by
   (local expert, source) makes each local expert's tokens contiguous;
2. the local experts run on their tokens with the local counts (summed over sources);
3. combine: the inverse permutation, then the inverse all-to-all returns every token's output
   to the rank (and the position) it came from.

Both all-to-alls are ``all_to_all_single_autograd``, whose backward is the reverse exchange, so
gradients reach the tokens' ranks and each expert's weights get the gradient of all the tokens
routed to it. Every token is computed by the same expert weights, in the same order within its
expert, as in one process: the layout changes only how the tokens travel.

Expert weights are then FSDP-sharded over the ranks that hold the same experts (``efsdp``,
distributed/expert_layout.py), in their own FSDP unit, before the dense FSDP wrapping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle


@dataclasses.dataclass
class _Exchange:
    """What the combine of one forward needs from its dispatch."""

    order: torch.Tensor
    """Received position of each token, in local-expert-major order."""
    sent: list[int]
    """Tokens this rank sent to each EP rank."""
    received: list[int]
    """Tokens this rank received from each EP rank."""


class ExpertParallel(ParallelStyle):
    """Shard a ``GroupedExperts`` module over a 1-D ``ep`` mesh (see the module docstring).

    One instance per experts module: it holds the dispatch state of the forward in flight
    (a forward's dispatch and combine always run back to back, also when activation
    checkpointing recomputes it).
    """

    def __init__(self) -> None:
        self._exchange: _Exchange | None = None

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, partition_fn=_shard_expert_dim,
                                 input_fn=self._dispatch, output_fn=self._combine)

    def _dispatch(self, module: nn.Module, inputs: tuple, mesh: DeviceMesh):
        tokens, counts = inputs[0], inputs[1]
        mesh = _ep_dim(mesh)
        ep, group = mesh.size(), mesh.get_group()
        local_experts = counts.numel() // ep
        counts_in = torch.empty_like(counts)
        dist.all_to_all_single(counts_in, counts, group=group)
        sent = counts.view(ep, local_experts).sum(1).tolist()
        received = counts_in.view(ep, local_experts).sum(1).tolist()
        tokens = all_to_all_single_autograd(tokens, received, sent, group)
        # chunk c of the received tokens = (source c // local_experts, expert c % local_experts)
        chunk = torch.repeat_interleave(torch.arange(ep * local_experts), counts_in.cpu())
        source, expert = chunk // local_experts, chunk % local_experts
        order = torch.argsort(expert * ep + source, stable=True).to(tokens.device)
        self._exchange = _Exchange(order=order, sent=sent, received=received)
        return tokens[order], counts_in.view(ep, local_experts).sum(0), *inputs[2:]

    def _combine(self, module: nn.Module, outputs: torch.Tensor, mesh: DeviceMesh):
        exchange, self._exchange = self._exchange, None
        assert exchange is not None, "ExpertParallel: combine without a dispatch"
        inverse = torch.argsort(exchange.order)
        return all_to_all_single_autograd(outputs[inverse], exchange.sent, exchange.received,
                                          _ep_dim(mesh).get_group())


EXPERT_HIDDEN_DIMS = {"w1": 1, "w3": 1, "w2": 2}
"""The hidden-feature dim of each GroupedExperts weight (w1, w3: [E, hidden, dim]; w2:
[E, dim, hidden]), along which tensor parallelism inside the experts (ETP) splits them."""


def _ep_dim(mesh: DeviceMesh) -> DeviceMesh:
    """The ``ep`` dim of the style's mesh: ``ep`` alone, or ``(ep, etp)`` under ETP = TP."""
    return mesh["ep"] if mesh.ndim == 2 else mesh


def _shard_expert_dim(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
    """Every parameter of the experts module becomes ``Shard(0)`` (its expert dim) over ep,
    and on a 2-D ``(ep, etp)`` mesh also split by hidden features over etp."""
    for param_name, param in list(module.named_parameters(recurse=False)):
        placements = [Shard(0)]
        if mesh.ndim == 2:
            placements.append(Shard(EXPERT_HIDDEN_DIMS[param_name]))
        sharded = nn.Parameter(distribute_tensor(param, mesh, placements),
                               requires_grad=param.requires_grad)
        module.register_parameter(param_name, sharded)


def apply_expert_parallel(experts: Iterable[nn.Module], mesh: DeviceMesh) -> None:
    """Shard every experts module over ``ep``, or over ``(ep, etp)`` with ETP = TP (each gets
    its own style instance). Under ETP = TP the experts run inside the MoE layer's local TP
    region (distributed/local_tp.py): the TP ranks of one EP group hold the same tokens, and
    each computes its hidden slice of its experts, a partial sum the region reduce-scatters."""
    for module in experts:
        ExpertParallel()._apply(module, mesh)


def apply_expert_fsdp(experts: Iterable[nn.Module], mesh: DeviceMesh, *,
                      param_dtype: torch.dtype, reduce_dtype: torch.dtype,
                      reshard: bool) -> set[nn.Parameter]:
    """One FSDP unit per experts module over the expert-FSDP mesh (efsdp, or (dp_replicate,
    efsdp) for HSDP); call before the dense ``apply_fsdp``, which sets sum reduction on every
    unit, these included.

    Returns the expert parameters the dense FSDP must leave alone (its ``ignored_params``):
    all of them when that mesh is a single rank. Then no other rank holds these experts, so
    their gradients need no reduction and sharding them would save nothing; leaving them out
    of FSDP also keeps FSDP's hooks out of activation-checkpointed blocks, where op-level SAC
    fails on a nested unit (its recompute issues FSDP ops its forward did not).
    """
    experts = list(experts)
    params = {p for module in experts for p in module.parameters()}
    if mesh.size() == 1:
        return params
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for module in experts:
        fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    return set()
