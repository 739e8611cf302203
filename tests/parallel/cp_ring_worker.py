"""torchrun entry of test_cp_cpu_sdpa.py: ring attention of sequence-sharded CPU tensors
against full SDPA, on CP meshes of 2 and 4 ranks, also with values narrower than queries and
keys (multi-head latent attention); rank 0 writes the results as JSON."""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

from torchtitan_like.distributed.context_parallel import values_padded_to_key_dim
from torchtitan_like.distributed.cp_cpu_sdpa import FORWARD, cpu_ring_attention
from torchtitan_like.distributed.lifecycle import exit_process

SHAPE = (2, 4, 32, 8)  # (batch, heads, seq, head_dim): 32 tokens = 2 x 4 head-tail chunks of CP4
NARROW_V = 6  # a value head dim below the query/key one, as MLA's


def ring_error(mesh: DeviceMesh, rotate: str, load_balance: bool, ring: bool = True,
               value_dim: int = SHAPE[3]) -> float:
    """Largest |difference| of the output and of dq, dk, dv between full causal SDPA and CP,
    compared on this rank's tokens (the references are sharded with the same layout). Values
    of ``value_dim`` below the query/key head dim are padded for the ring (the trainer's CP
    context does it, distributed/context_parallel.py); the reference is unpadded SDPA."""
    q, k = torch.randn(SHAPE), torch.randn(SHAPE)
    v, grad_out = torch.randn(*SHAPE[:3], value_dim), torch.randn(*SHAPE[:3], value_dim)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    out.backward(grad_out)
    expected = [out.detach(), *(t.grad for t in leaves)]
    buffers = [q, k, v, grad_out, *expected]
    set_rotate_method(rotate)
    _cp_options.enable_load_balance = load_balance
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * len(buffers),
                          no_restore_buffers=set(buffers)):
        with cpu_ring_attention() if ring else torch.enable_grad(), values_padded_to_key_dim():
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = F.scaled_dot_product_attention(*leaves, is_causal=True)
            out.backward(grad_out)
        actual = [out.detach(), *(t.grad for t in leaves)]
    assert all(a.shape[2] == SHAPE[2] // mesh.size() for a in actual)
    return max((a - e).abs().max().item() for a, e in zip(actual, expected, strict=True))


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    meshes = {2: init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp"))["cp"],
              4: init_device_mesh("cpu", (4,), mesh_dim_names=("cp",))}
    results: dict[str, object] = {}
    for size, mesh in meshes.items():
        for rotate in ("allgather", "alltoall"):
            for load_balance in (True, False):
                key = f"cp{size}_{rotate}_{'headtail' if load_balance else 'none'}"
                results[key] = ring_error(mesh, rotate, load_balance)
        results[f"cp{size}_narrow_values"] = ring_error(mesh, "alltoall", True,
                                                        value_dim=NARROW_V)
    propagator = DTensor._op_dispatcher.sharding_propagator
    results["restored"] = (FORWARD not in DTensor._op_dispatcher._custom_op_handlers
                           and FORWARD not in propagator.op_strategy_funcs)
    try:
        ring_error(meshes[2], "allgather", True, ring=False)
        results["stock"] = "ran"
    except Exception as e:  # what torch says without this module
        results["stock"] = str(e)
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, results)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(errors, f)
    exit_process(0)


if __name__ == "__main__":
    main()
