"""The tail every parallelization plan ends with, for the built-in models and models of your own.

A plan (``ModelSpec.parallelize_fn``) takes one model part and returns it parallelized, in the
order tensor parallel (``apply_tp`` with the model's ``TPPlan``, distributed/tensor_parallel.py)
-> (context parallel, per step) -> expert parallel -> activation checkpointing -> compile ->
FSDP2. ``apply_block_tail`` is everything after TP, over a model's blocks.

After the plan ran, the trainer checks that what the config asked for took effect
(``check_plan_applied``): a plan that forgets a step stops the job with one error naming the
model and the switch instead of silently training something else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import nn

from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.distributed.activation_checkpoint import apply_ac
from torchtitan_like.distributed.compile import apply_compile
from torchtitan_like.distributed.expert_layout import expert_fsdp_mesh
from torchtitan_like.distributed.expert_parallel import apply_expert_fsdp, apply_expert_parallel
from torchtitan_like.distributed.fsdp import apply_fsdp, reshard_after_forward

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims


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
