"""Newton-Schulz orthogonalization of many matrices at once, each on the rank that owns it.

The iteration is torch.optim.Muon's own, called, not rewritten: ``torch.optim._muon.
_zeropower_via_newtonschulz`` with its quintic coefficients (3.4445, -4.7750, 2.0315), its
Frobenius normalisation and its bf16 arithmetic. ``dtype = float32`` runs the same function in
fp32: its one cast to bf16 is intercepted (``_Float32``) and becomes an fp32 copy, every other
operation is unchanged. (fp32 is what the parity tests run: on CPU it is also the faster one
where bf16 matmuls are not native, and it keeps the layouts within reordered-sum distance.)

Where the matrices are. A parameter is a matrix, or a stack of matrices along its leading
dims (a routed-expert weight [E, m, n]: each expert's matrix is independent). Under a layout
each rank holds a DTensor shard; a mesh dim whose placement shards one of the two matrix dims
(FSDP's rows, TP's rows or columns, HSDP's shard dim) is a *gather dim*; one that shards a
leading dim (EP over experts, FSDP over an expert stack) or replicates (HSDP's replicas, a
TP-replicated weight) needs nothing: every rank already holds whole matrices there.

- No gather dim (one device, EP's experts, a pipeline stage's own matrices, replicas): each rank
  iterates the whole matrices it holds, locally. No communication, no gather over experts.
- Gather dims (FSDP, HSDP, TP, FSDP x TP): the parameters of one shape and placement are stacked
  into one DTensor [K, ...] and redistributed so that the stack dim is sharded over the gather
  dims and the matrix dims are whole: each of the N ranks of the gather dims receives the whole
  matrices of about K/N owners' share (torch.chunk: ceil(K/N) to the first ranks), iterates
  them, and the results are redistributed back to the original shards. Each matrix is iterated
  once per replica group, by one owner: the work is split N ways, not repeated. The iteration
  of an owned matrix sees bitwise the update one process would (redistribution moves values,
  never sums them), so the distributed step equals the one-process step on the same gradients.
  TP's matrices are assembled across the TP group this way too: exact, no per-block
  approximation.

Traffic: the matrices travel in the iteration's dtype (bf16 by default: torch's iteration casts
to bf16 first anyway, so casting before the transfer changes no value). DTensor picks the
collectives: on NCCL a shard-dim change over one mesh dim is an all-to-all, each rank sending
(N-1)/N of its shards there and back (what tools/planner/optimizer.py counts); gloo has no
all-to-all, and DTensor all-gathers and slices instead (the same values, N x the traffic); with
two gather dims (FSDP x TP, a strided FSDP shard) it goes through all-gathers as well.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import Placement, _StridedShard
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, EPS, _zeropower_via_newtonschulz
from torch.overrides import TorchFunctionMode


@dataclasses.dataclass(frozen=True)
class Iteration:
    """torch.optim.Muon's iteration settings."""

    steps: int = 5
    dtype: torch.dtype = torch.bfloat16
    coefficients: tuple[float, float, float] = (DEFAULT_A, DEFAULT_B, DEFAULT_C)
    eps: float = EPS


class _Float32(TorchFunctionMode):
    """Inside torch's iteration, its cast to bf16 returns an fp32 copy instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.bfloat16:
            return args[0].clone()
        return func(*args, **(kwargs or {}))


def newton_schulz(matrix: torch.Tensor, it: Iteration) -> torch.Tensor:
    """torch.optim.Muon's orthogonalization of one 2-D ``matrix`` (in ``it.dtype``, which it
    may overwrite), in ``it.dtype``."""
    if it.dtype == torch.float32:
        with _Float32():
            return _zeropower_via_newtonschulz(matrix, it.coefficients, it.steps, it.eps)
    return _zeropower_via_newtonschulz(matrix, it.coefficients, it.steps, it.eps)


def _iterate(stack: torch.Tensor, it: Iteration) -> torch.Tensor:
    """Every matrix of ``stack`` ([..., m, n], whole matrices) orthogonalized; each one
    copied out first, so it starts in a fresh, aligned buffer as in one process."""
    flat = stack.reshape(-1, *stack.shape[-2:])
    out = [newton_schulz(matrix.clone(), it) for matrix in flat]
    return torch.stack(out).reshape(stack.shape) if out else flat.reshape(stack.shape)


def _shifted(placement: Placement) -> Placement:
    """The placement of a parameter dim, for the same dim of a stack of such parameters."""
    if isinstance(placement, _StridedShard):
        return _StridedShard(placement.dim + 1, split_factor=placement.split_factor)
    if isinstance(placement, Shard):
        return Shard(placement.dim + 1)
    return placement


def gather_dims(param: torch.Tensor) -> list[int]:
    """The mesh dims over which ``param``'s matrices are split (module docstring)."""
    if not isinstance(param, DTensor):
        return []
    mesh = param.device_mesh
    return [i for i, p in enumerate(param.placements)  # (_StridedShard is no Shard subclass)
            if isinstance(p, Shard | _StridedShard) and p.dim >= param.ndim - 2
            and mesh.size(i) > 1]


def _bucket_key(param: torch.Tensor) -> tuple:
    if not gather_dims(param):
        return ("local",)
    return (tuple(param.shape), param.device_mesh, tuple(param.placements))


def orthogonalize(params: list[torch.Tensor], updates: list[torch.Tensor], it: Iteration
                  ) -> tuple[list[torch.Tensor], int]:
    """For each parameter (see the module docstring), its orthogonalized update as this
    rank's local shard (``updates``: the local shards of the updates), in ``it.dtype``; and
    the number of matrices this rank iterated."""
    buckets: dict[tuple, list[int]] = {}
    for i, param in enumerate(params):
        buckets.setdefault(_bucket_key(param), []).append(i)
    results: list[torch.Tensor | None] = [None] * len(params)
    count = 0
    for key, indices in buckets.items():
        local = [updates[i].to(it.dtype) for i in indices]
        if key == ("local",):
            outs = [_iterate(u, it) for u in local]
            count += sum(math.prod(u.shape[:-2]) for u in local)
        else:
            outs, owned = _iterate_owned(params[indices[0]], local, it)
            count += owned
        for i, out in zip(indices, outs, strict=True):
            results[i] = out
    return results, count  # type: ignore[return-value]


def _iterate_owned(param: DTensor, local: list[torch.Tensor], it: Iteration
                   ) -> tuple[list[torch.Tensor], int]:
    """The updates of parameters placed like ``param`` (their local shards ``local``),
    iterated by their owners (module docstring); and how many matrices this rank iterated."""
    mesh, gather = param.device_mesh, set(gather_dims(param))
    shape = (len(local), *param.shape)
    stride = torch.empty(shape, device="meta").stride()
    sharded = [_shifted(p) for p in param.placements]
    owned = [Shard(0) if i in gather else p for i, p in enumerate(sharded)]
    stack = DTensor.from_local(torch.stack(local), mesh, sharded, shape=shape, stride=stride)
    whole = stack.redistribute(mesh, owned).to_local()
    done = DTensor.from_local(_iterate(whole, it), mesh, owned, shape=shape, stride=stride)
    back = done.redistribute(mesh, sharded).to_local()
    return list(back.unbind(0)), math.prod(whole.shape[:-2])
