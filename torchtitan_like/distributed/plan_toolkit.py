"""Building blocks of a parallelization plan, for the built-in models and models of your own.

A plan (``ModelSpec.parallelize_fn``) takes one model part and returns it parallelized, in the
order tensor parallel -> (context parallel) -> activation checkpointing -> compile -> FSDP2.
This module gives the pieces most plans share:

- TP styles for the common block shapes, for ``parallelize_module`` on one block:
  ``attention_plan`` (column-wise q/k/v, row-wise output), ``swiglu_plan`` (column-wise gate and
  up, row-wise down), both with sequence-parallel input/output (hidden states ``Shard(1)``
  between modules), and ``NoParallel`` for a module that stays whole on every TP rank (a MoE
  router, a small gate): its parameters become replicated DTensors on the TP mesh, so that
  gradient clipping, FSDP and checkpoints treat them like every other parameter.
- ``apply_block_tail``: activation checkpointing -> compile -> FSDP over a model's blocks,
  the tail every plan ends with.

After the plan ran, the trainer checks that what the config asked for took effect
(``check_plan_applied``): a plan that forgets a step stops the job with one error naming the
model and the switch instead of silently training something else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ParallelStyle

from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.distributed.activation_checkpoint import apply_ac
from torchtitan_like.distributed.compile import apply_compile
from torchtitan_like.distributed.expert_layout import expert_fsdp_mesh
from torchtitan_like.distributed.expert_parallel import apply_expert_fsdp, apply_expert_parallel
from torchtitan_like.distributed.float8_tp import tp_styles
from torchtitan_like.distributed.fsdp import apply_fsdp, reshard_after_forward

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims


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


BlockGroups = nn.ModuleDict | Sequence[nn.ModuleDict | None]
"""One ModuleDict of blocks, or several (a trunk and a multi-token-prediction group, ...);
None entries (groups a pipeline stage dropped) are skipped."""


def _group_list(blocks: BlockGroups) -> list[nn.ModuleDict]:
    """``blocks`` as a list of the ModuleDicts it names."""
    if isinstance(blocks, nn.ModuleDict):
        return [blocks]
    return [group for group in blocks if group is not None]


def apply_block_tail(model: nn.Module, blocks: BlockGroups, parallel_dims: ParallelDims,
                     meshes: Meshes, config: JobConfig, *,
                     before: Sequence[Sequence[nn.Module | None]] = (),
                     after: Sequence[Sequence[nn.Module | None]] = (),
                     routed_experts: Sequence[nn.Module] = ()) -> None:
    """Expert parallelism -> activation checkpointing -> compile -> FSDP2 over the blocks of
    ``blocks`` (a ModuleDict, or several, each changed in place), the shared tail of every
    plan. AC's every-N-th rule counts within each group. FSDP units, in forward order: the
    groups ``before`` the blocks (e.g. the embedding), one per block (group after group), the
    groups ``after`` them (e.g. norm + head), and the rest of ``model`` as the root unit (None
    entries, modules a pipeline stage dropped, are skipped). A module used twice in a forward
    (a weight shared by the trunk and an extra head) belongs in the root unit. Under EP,
    ``routed_experts`` (the GroupedExperts of the part's MoE layers) are sharded over ``ep``
    with the token all-to-alls, then get their own FSDP units over the expert-FSDP mesh
    (distributed/expert_parallel.py); under compile, the blocks holding them are compiled
    around them (distributed/compile.py)."""
    groups = _group_list(blocks)
    if parallel_dims.ep_enabled:
        apply_expert_parallel(routed_experts, meshes.expert["ep", "etp"] if parallel_dims.etp > 1
                              else meshes.expert["ep"])
    for group in groups:
        apply_ac(group, config.activation_checkpoint)
        apply_compile(group, config.compile, routed_experts)
    if not parallel_dims.fsdp_enabled:
        return
    param_dtype = DTYPES[config.training.mixed_precision_param]
    reduce_dtype = DTYPES[config.training.mixed_precision_reduce]
    reshard = reshard_after_forward(config.parallelism.fsdp_reshard_after_forward,
                                    parallel_dims.pp > 1)
    ignored: set[nn.Parameter] = set()
    if parallel_dims.ep_enabled:
        ignored = apply_expert_fsdp(routed_experts, expert_fsdp_mesh(meshes.expert),
                                    param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                    reshard=reshard)
    units = [[block] for group in groups for block in group.values()]
    apply_fsdp(model, meshes.fsdp, [*before, *units, *after], param_dtype=param_dtype,
               reduce_dtype=reduce_dtype, reshard=reshard, ignored_params=ignored)
