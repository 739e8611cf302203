"""The host's dispatch costs (tools/planner/overheads.py: ``host_seconds``), measured on this
machine for ``ttl-plan --calibrate``: a Llama block of tiny width (64, 4 heads, 16 tokens), so
that its kernels take next to nothing and a forward and backward costs what the host spends
issuing its ops (Python, autograd, the dispatcher, the launch). Per op: that time over the ops
the block issues (counted by a dispatch mode); with the block's TP plan on a one-rank mesh
(every op through DTensor, no transfer), the extra per op; compiled, the share left; with
FSDP on a one-rank mesh, the extra per unit."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _tiny_block(device: torch.device) -> tuple[Any, Callable[[torch.nn.Module], None]]:
    """A tiny Llama block and one forward and backward of it (as a function of the block)."""
    from torchtitan_like.models.llama3.args import llama3_flavors
    from torchtitan_like.models.llama3.model import Transformer

    args = dataclasses.replace(llama3_flavors["debugmodel"], dim=64, n_heads=4, n_layers=1,
                               vocab_size=64, max_seq_len=16)
    with torch.device(device):
        model = Transformer(args)
        model.init_weights()
        x = torch.randn(1, 16, args.dim, requires_grad=True)

    def step(block: torch.nn.Module) -> None:
        block(x, model.rope_cache).sum().backward()

    return model, step


def _per_call(fn: Callable[[], None], device: torch.device, calls: int = 100) -> float:
    """The fastest of three runs of ``calls`` calls, seconds per call (a fixed count: no
    collective inside, but the same work on every rank)."""
    fn()
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def measure_host_costs(device: torch.device, compiled: bool) -> dict[str, float]:
    """host_op_s, host_dtensor_op_s, host_fsdp_unit_s (and host_compiled_share when
    ``compiled``) on this rank (every rank calls it: it makes one-rank process groups)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from torchtitan_like.models.llama3.parallelize import block_tp_plan

    own, _ = dist.new_subgroups(group_size=1)
    mesh = DeviceMesh.from_group(own, device.type)
    model, step = _tiny_block(device)
    block = model.layers["0"]
    counter = _CountOps()
    with counter:
        step(block)
    eager = _per_call(lambda: step(block), device) / counter.ops
    out = {"host_op_s": eager}
    if compiled:
        compiled_block = torch.compile(block)
        out["host_compiled_share"] = _per_call(lambda: step(compiled_block), device) \
            / counter.ops / eager
    sharded_model, sharded_step = _tiny_block(device)
    fully_shard(sharded_model.layers["0"], mesh=mesh)
    out["host_fsdp_unit_s"] = max(0.0, _per_call(lambda: sharded_step(sharded_model.layers["0"]),
                                                 device) - eager * counter.ops)
    parallelize_module(block, mesh, block_tp_plan(block, device.type))
    out["host_dtensor_op_s"] = max(0.0, _per_call(lambda: step(block), device) / counter.ops
                                   - eager)
    return out
