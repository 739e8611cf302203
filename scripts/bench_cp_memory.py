"""Activation memory per rank against sequence length, without CP and with CP=2.

    torchrun --standalone --nproc_per_node=2 scripts/bench_cp_memory.py
    torchrun --standalone --nproc_per_node=2 scripts/bench_cp_memory.py --flavor tiny \
        --seq-lens 256,512 --rotate alltoall

One training step (model + loss forward, backward) of the Llama 3 model (fp32, batch 1) per
sequence length, measured by ``components/memory.py: measure_step_memory`` (MemTracker, which
sees CPU tensors): the activations held when forward returns, i.e. what the step keeps for
backward, in all and per transformer block. CP=1 is one rank running the whole sequence alone;
CP=2 is both ranks inside the trainer's CP context (distributed/context_parallel.py), each
holding half of the tokens; the busier rank is reported. Parameters are not sharded here (no
FSDP), so the figures isolate what CP divides. Prints a table and asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from torchtitan_like.components.memory import measure_step_memory
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed import context_parallel
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.models.registry import get_model_args, get_model_spec
from torchtitan_like.protocols.loss import cross_entropy_sum

MiB = 2**20


def held_for_backward(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                      context) -> tuple[int, int]:
    """(activation bytes when forward returns, the largest per-block footprint) of one step."""
    with context(inputs, labels):
        memory = measure_step_memory(model, lambda: cross_entropy_sum(model(inputs), labels),
                                     device=inputs.device, blocks=list(model.layers.values()))
    return memory.after_forward["Activation"], max(memory.per_block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flavor", default="debugmodel")
    parser.add_argument("--seq-lens", default="512,1024,2048")
    parser.add_argument("--rotate", default="allgather", choices=["allgather", "alltoall"])
    args = parser.parse_args()

    dist.init_process_group("gloo")
    cp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
    spec = get_model_spec("llama3")
    rows = []
    for seq_len in (int(s) for s in args.seq_lens.split(",")):
        config = JobConfig()
        config.training.seq_len = seq_len
        config.parallelism.context_parallel_degree = cp
        config.parallelism.context_parallel_rotate_method = args.rotate
        model_args = get_model_args(spec, args.flavor)
        model_args.update_from_config(config)
        torch.manual_seed(0)
        model = spec.model_cls(model_args)
        model.init_weights()
        batch = torch.randint(0, model_args.vocab_size, (1, seq_len + 1))
        whole = held_for_backward(model, batch[:, :-1].clone(), batch[:, 1:].clone(),
                                  lambda _inputs, _labels: contextlib.nullcontext())
        cp_context = context_parallel.build_context(
            ParallelDims.resolve(cp, cp=cp), mesh, config, spec, [model])
        sharded = torch.tensor(held_for_backward(model, batch[:, :-1].clone(),
                                                 batch[:, 1:].clone(), cp_context))
        dist.all_reduce(sharded, op=dist.ReduceOp.MAX)  # the busier rank
        rows.append((seq_len, *whole, *sharded.tolist()))

    if dist.get_rank() == 0:
        print(f"Llama 3 {args.flavor}, batch 1, fp32, rotate {args.rotate}: activations held "
              "for backward per rank, in MiB (all blocks + head and loss; largest block)")
        print(f"| seq_len | CP=1 | CP={cp} per rank | ratio | CP=1 per block | "
              f"CP={cp} per block |")
        print("|---:|---:|---:|---:|---:|---:|")
        for seq_len, whole, whole_block, sharded, sharded_block in rows:
            print(f"| {seq_len} | {whole / MiB:.1f} | {sharded / MiB:.1f} | "
                  f"{sharded / whole:.2f} | {whole_block / MiB:.2f} | "
                  f"{sharded_block / MiB:.2f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
