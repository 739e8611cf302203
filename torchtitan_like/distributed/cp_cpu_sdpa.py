"""Ring attention for CPU SDPA under ``context_parallel``: the one place that touches torch's
private context-parallel internals, used only when CP runs on CPU.

Why it exists. ``torch.distributed.tensor.experimental.context_parallel`` turns q, k and v into
DTensors sharded along the sequence (``Shard(2)`` of (batch, heads, seq, head_dim)) and relies
on DTensor dispatching the SDPA kernel to its ring-attention implementation. It knows only the
CUDA kernels (flash, memory-efficient, cuDNN). On CPU, SDPA runs
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its ``_backward`` in autograd), for
which DTensor has no sharding strategy, so the first attention fails.

What it does, for as long as ``cpu_ring_attention()`` is entered (inside ``context_parallel``):

1. registers a DTensor sharding strategy for the two CPU ops that keeps every tensor sequence
   sharded (``Shard(2)`` in and out; the log-sum-exp (batch, heads, seq) too), so that sharding
   propagation accepts the CP layout without redistributing anything;
2. installs a DTensor custom-op handler for them that runs torch's own ring attention
   (``_templated_ring_attention`` forward and ``_templated_ring_attention_backward``) on the
   local shards with the CPU kernel as the per-block op, exactly as torch does for the CUDA
   flash kernel. The CPU kernel has the same contract the ring needs: it returns the block
   output and its log-sum-exp (merged across blocks by the online softmax), and its backward
   takes (grad_out, q, k, v, out, logsumexp).

On exit both are removed again, so DTensor outside CP behaves as stock torch.

It is written against torch 2.13 (``SUPPORTED_TORCH``). Another version may move or change
these private names: ``check_supported`` refuses it at config validation with a clear message
(on CUDA the stock path is used and this module is never entered).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.device_mesh import DeviceMesh

SUPPORTED_TORCH = ((2, 13),)
"""torch (major, minor) versions whose private CP internals this module was tested against."""

SEQ_DIM = 2
"""Sequence dim of SDPA's (batch, heads, seq, head_dim) tensors; torch's CP hard-codes it."""

aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def check_supported() -> str | None:
    """None if this torch can run CP on CPU, else why not (for a ConfigError)."""
    if torch_version() in SUPPORTED_TORCH:
        return None
    tested = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_TORCH)
    return (f"context parallelism on CPU patches torch's private ring-attention internals, "
            f"written for torch {tested}; this is torch {torch.__version__}. Use a tested torch "
            "(or CUDA, where torch's own path is used), or extend and re-test "
            "torchtitan_like/distributed/cp_cpu_sdpa.py")


def _all_sequence_sharded(n_outputs: int):
    """A strategy function: every tensor output and input stays ``Shard(SEQ_DIM)``."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._op_schema import OpSchema, OpStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    def strategy(op_schema: OpSchema) -> OpStrategy:
        n_inputs = sum(isinstance(a, OpStrategy) for a in op_schema.args_schema)
        return expand_to_full_mesh_op_strategy(
            op_schema.get_mesh_from_args(validate=False), op_schema,
            [[Shard(SEQ_DIM)] * (n_outputs + n_inputs)], input_index=n_outputs,
        )

    return strategy


def _ring_forward(mesh: DeviceMesh, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, dropout_p: float = 0.0, is_causal: bool = False, *,
                  attn_mask: torch.Tensor | None = None,
                  scale: float | None = None) -> tuple[torch.Tensor, ...]:
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention,
    )

    if attn_mask is not None:
        raise NotImplementedError("context parallelism shards causal SDPA only, not attn_mask")
    return _templated_ring_attention(mesh.get_group(), SEQ_DIM, FORWARD, query=query, key=key,
                                     value=value, is_causal=is_causal, dropout_p=dropout_p,
                                     scale=scale)


def _ring_backward(mesh: DeviceMesh, grad_out: torch.Tensor, query: torch.Tensor,
                   key: torch.Tensor, value: torch.Tensor, out: torch.Tensor,
                   logsumexp: torch.Tensor, dropout_p: float, is_causal: bool, *,
                   attn_mask: torch.Tensor | None = None,
                   scale: float | None = None) -> tuple[torch.Tensor, ...]:
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention_backward,
    )

    return _templated_ring_attention_backward(
        mesh.get_group(), SEQ_DIM, BACKWARD, grad_out=grad_out, grad_out_name="grad_out",
        query=query, key=key, value=value, out=out, logsumexp=logsumexp, is_causal=is_causal,
        dropout_p=dropout_p, attn_mask=attn_mask, scale=scale,
    )


_RING = {FORWARD: _ring_forward, BACKWARD: _ring_backward}


def _ring_handler(op_call: torch._ops.OpOverload, args: tuple[object, ...],
                  kwargs: dict[str, object]) -> object:
    """DTensor custom-op handler: propagate the (sequence-sharded) layout, run the ring on the
    local shards, wrap the local results back into DTensors."""
    from torch.distributed.tensor import DTensor

    dispatcher = DTensor._op_dispatcher
    op_info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    dispatcher.sharding_propagator.propagate(op_info)
    sharding = op_info.output_sharding
    if sharding is None or sharding.needs_redistribute:
        raise RuntimeError(f"{op_call}: q, k, v must all be sequence-sharded by context_parallel")
    local = _RING[op_call](op_info.compute_mesh, *op_info.local_args, **op_info.local_kwargs)
    return dispatcher.wrap(local, sharding.output_spec)


@contextlib.contextmanager
def cpu_ring_attention() -> Iterator[None]:
    """Route the CPU SDPA kernels of sequence-sharded DTensors into ring attention (see the
    module docstring); enter it inside ``context_parallel``."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental._context_parallel._sharding_rules import (
        _op_strategy_context,
    )

    handlers = DTensor._op_dispatcher._custom_op_handlers
    with contextlib.ExitStack() as stack:
        for op, n_outputs in ((FORWARD, 2), (BACKWARD, 3)):
            stack.enter_context(_op_strategy_context(op, _all_sequence_sharded(n_outputs)))
        handlers.update(dict.fromkeys(_RING, _ring_handler))
        try:
            yield
        finally:
            for op in _RING:
                handlers.pop(op, None)
