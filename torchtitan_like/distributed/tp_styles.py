"""Tensor-parallel styles for the module shapes plans share; ``apply_tp``
(distributed/tensor_parallel.py) applies them where a model's ``TPPlan`` says.

- ``attention_plan`` (column-wise q/k/v, row-wise output) and ``swiglu_plan`` (column-wise
  gate and up, row-wise down): Megatron's pair around one module, with sequence-parallel
  input and output (hidden states ``Shard(1)`` between modules) and torchao's float8 styles
  where the linears are float8 (distributed/float8_tp.py). Each returns ``parallelize_module``
  entries for one block; add ``SequenceParallel()`` for its norms.
- ``NoParallel``: a module that stays whole on every TP rank (a MoE router, a small gate): its
  parameters become replicated DTensors on the TP mesh, so that gradient clipping, FSDP and
  checkpoints treat them like every other parameter.
- ``embedding_style``: an embedding table split by vocabulary rows.
- ``nested``: a submodule's entries under its name (a block inside a larger module).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ParallelStyle, RowwiseParallel

from torchtitan_like.distributed.float8_tp import tp_styles


class NoParallel(ParallelStyle):
    """Keep a module whole on every TP rank: parameters become ``Replicate()`` DTensors on the
    TP mesh, plain-tensor inputs are taken as replicated and outputs come back as plain local
    tensors (with ``use_local_output``). Every TP rank computes the same values; the input
    must be the same on every TP rank (e.g. after a sequence-parallel all-gather)."""

    def __init__(self, use_local_output: bool = True):
        super().__init__()
        self.use_local_output = use_local_output

    def _inputs(self, _module, args, mesh: DeviceMesh):
        return tuple(DTensor.from_local(a, mesh, [Replicate()], run_check=False)
                     if isinstance(a, torch.Tensor) and not isinstance(a, DTensor) else a
                     for a in args)

    def _outputs(self, _module, outputs, _mesh: DeviceMesh):
        if not self.use_local_output:
            return outputs
        if isinstance(outputs, DTensor):
            return outputs.to_local()
        if isinstance(outputs, tuple):
            return tuple(o.to_local() if isinstance(o, DTensor) else o for o in outputs)
        return outputs

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, None, self._inputs, self._outputs)


def _sequence_parallel_pair(block: nn.Module, device_type: str, name: str, colwise: list[str],
                            rowwise: str, extra_inputs: int) -> dict[str, ParallelStyle]:
    """Megatron's pair around ``block.<name>``: its sequence-sharded input is all-gathered,
    the ``colwise`` linears split their output features, ``rowwise`` its input features and
    reduce-scatters back to sequence shards. ``extra_inputs`` positional arguments after the
    hidden state (e.g. the RoPE table) pass through untouched. Float8 linears get torchao's
    float8 styles where they apply (components/float8.py)."""
    styles = tp_styles(block.get_submodule(name), device_type)
    passed = [None] * extra_inputs
    plan: dict[str, ParallelStyle] = {
        name: styles.prepare_input(input_layouts=(Shard(1), *passed),
                                   desired_input_layouts=(Replicate(), *passed)),
    }
    plan.update({f"{name}.{linear}": styles.colwise() for linear in colwise})
    plan[f"{name}.{rowwise}"] = styles.rowwise(output_layouts=Shard(1))
    return plan


def attention_plan(block: nn.Module, device_type: str, name: str = "attention",
                   qkv: tuple[str, ...] = ("wq", "wk", "wv"), out: str = "wo",
                   extra_inputs: int = 1) -> dict[str, ParallelStyle]:
    """TP plan entries for multi-head attention ``block.<name>`` on a TP mesh of
    ``device_type`` (heads split over TP ranks: its forward must infer the local head count,
    e.g. ``view(bs, seq, -1, head_dim)``)."""
    return _sequence_parallel_pair(block, device_type, name, list(qkv), out, extra_inputs)


def swiglu_plan(block: nn.Module, device_type: str, name: str = "feed_forward",
                gate_up: tuple[str, ...] = ("w1", "w3"), down: str = "w2",
                extra_inputs: int = 0) -> dict[str, ParallelStyle]:
    """TP plan entries for a SwiGLU (or any up-projection, activation, down-projection)
    feed-forward ``block.<name>`` (hidden features split over TP ranks)."""
    return _sequence_parallel_pair(block, device_type, name, list(gate_up), down, extra_inputs)


def embedding_style() -> ParallelStyle:
    """An embedding table split by vocabulary rows: each rank looks up the ids it owns (zeros
    elsewhere), and the partial lookups are reduce-scattered into sequence shards (Shard(1))."""
    return RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))


def nested(prefix: str, plan: dict[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """``plan``'s entries for the submodule ``prefix`` of the module being parallelized."""
    return {f"{prefix}.{name}": style for name, style in plan.items()}
