"""After a model's plan ran: did what the config asked for take effect?

A custom plan (``ModelSpec.parallelize_fn``) that forgets a step would otherwise train
something else without a word: no activation checkpointing under ``mode = "full"`` (an
ablation then reports identical variants), eager blocks under ``[compile] enable``, under TP
replicated copies of parameters while throughput is divided by the TP degree as if TP ran, or,
with data parallelism, parameters that no FSDP unit shards or replicates over the data-parallel
ranks: each rank then trains its own replica on its own data (the losses drift apart, the
gradient norm is one rank's). The trainer calls ``check_plan_applied`` on its model parts right
after the plan and stops with one error naming the model, the switch and the module.

Activation checkpointing and compile are checked block by block in every *block group* of a
part: each top-level ``nn.ModuleDict`` keyed ``"0"``, ``"1"``, ... (the layout the pipeline
split and ``plan_toolkit.apply_block_tail`` work on; a trunk, a multi-token-prediction group).
A part without such groups needs one wrapped (compiled) module.

Loss parallel cannot be seen in the modules: whether the head hands the loss vocab-sharded
logits is a forward hook's choice. A model whose plan gathers them declares it
(``ModelSpec.loss_parallel = False``; the job then records loss parallel as off at start-up,
distributed/tensor_parallel.py), and ``checked_loss`` checks the logits the loss receives
against the recorded setting at every call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.tensor import DTensor

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.activation_checkpoint import every_nth_layer

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import ActivationCheckpoint, JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims

DATA_PARALLEL_DIMS = ("dp_replicate", "dp_shard", "cp", "dp_shard_cp", "dp", "dp_cp", "efsdp",
                      "ep")
"""Mesh dims whose ranks hold the same slice of a parameter and read different data (or, for
``ep``, different tokens): a parameter must be sharded or replicated over all of them."""
SPLIT_DIMS = ("tp", "etp")
"""Mesh dims whose ranks hold different slices of a parameter (or, replicated, the same
values by TP's own contract)."""

_FIX = ("model {model!r}: its parallelize_fn (ModelSpec) did not apply {what}; call "
        "distributed/plan_toolkit.py's apply_block_tail (with every block group) or the step "
        "itself in the plan, or {alternative}")


def _compiled(module: nn.Module) -> bool:
    """``Module.compile`` compiles in place; ``torch.compile(module)`` wraps it; a plan may
    also replace a module's ``forward`` by a compiled one (distributed/compile.py)."""
    forward = vars(module).get("forward")
    return (getattr(module, "_compiled_call_impl", None) is not None
            or type(module).__name__ == "OptimizedModule"
            or hasattr(forward, "_torchdynamo_orig_callable"))


def _on_tp_mesh(parameter: nn.Parameter) -> bool:
    """On the TP mesh, or (routed experts) on the expert mesh: its ``etp`` dim under ETP = TP,
    its ``ep`` dim under ETP = 1 (expert parallelism borrowed the TP ranks)."""
    dims = (parameter.device_mesh.mesh_dim_names or ()) if isinstance(parameter, DTensor) else ()
    return bool({"tp", "etp", "ep"} & set(dims))


def block_groups(part: nn.Module) -> dict[str, nn.ModuleDict]:
    """The part's block groups (module docstring) that a pipeline stage kept blocks of."""
    return {name: child for name, child in part.named_children()
            if isinstance(child, nn.ModuleDict) and len(child)
            and all(key.isdigit() for key in child)}


def _blocks(part: nn.Module) -> list[tuple[str, int, nn.Module]]:
    """(name, position in its group, block) for every block of every group of ``part``."""
    return [(f"{group_name}.{key}", i, block) for group_name, group in block_groups(part).items()
            for i, (key, block) in enumerate(group.items())]


def _ac_missing(part: nn.Module, ac: ActivationCheckpoint) -> str | None:
    """The first block whose wrapping contradicts ``ac`` (every block under full or op-level
    SAC, every N-th of each group under ``selective_ac_option = N``), else None."""
    every = (every_nth_layer(ac.selective_ac_option)
             if ac.mode == "selective" and ac.selective_ac_option != "op" else 1)
    blocks = _blocks(part)
    if not blocks:
        return None if any(isinstance(m, CheckpointWrapper) for m in part.modules()) \
            else "any module"
    for name, i, block in blocks:
        if (i % every == 0) != any(isinstance(m, CheckpointWrapper) for m in block.modules()):
            return f"block {name}" + ("" if i % every == 0 else " (not an N-th block)")
    return None


def _compile_missing(part: nn.Module) -> str | None:
    """The first block of the part with nothing compiled in it, else None."""
    blocks = _blocks(part)
    if not blocks:
        return None if any(_compiled(m) for m in part.modules()) else "any module"
    return next((f"block {name}" for name, _, block in blocks
                 if not any(_compiled(m) for m in block.modules())), None)


def _data_parallel_coverage(parameter: nn.Parameter) -> tuple[int, int]:
    """(ranks it is sharded or replicated over on data-parallel dims, ranks splitting it)."""
    if not isinstance(parameter, DTensor):
        return 1, 1
    mesh = parameter.device_mesh
    sizes = dict(zip(mesh.mesh_dim_names or (), mesh.shape, strict=True))
    return (math.prod(sizes.get(d, 1) for d in DATA_PARALLEL_DIMS),
            math.prod(sizes.get(d, 1) for d in SPLIT_DIMS))


def _unsynchronised(parts: list[nn.Module], parallel_dims: ParallelDims
                    ) -> list[tuple[str, int]]:
    """(name, ranks covered) of parameters not spread over all the ranks that hold the same
    stage: the product of a parameter's data-parallel and split mesh dims must be the world
    size over the pipeline degree (dense weights: dp_replicate x dp_shard x cp x tp; routed
    experts: dp_replicate x efsdp x ep x etp, the same ranks seen as the expert mesh)."""
    stage_ranks = parallel_dims.world_size // parallel_dims.pp
    missed = []
    for part in parts:
        for name, p in part.named_parameters():
            covered, split = _data_parallel_coverage(p)
            if covered * split != stage_ranks:
                missed.append((name, covered))
    return missed


def check_plan_applied(model_name: str, parts: list[nn.Module], parallel_dims: ParallelDims,
                       config: JobConfig) -> None:
    """Raise ConfigError if a model part lacks what the config switched on."""
    def refuse(what: str, alternative: str) -> None:
        raise ConfigError(_FIX.format(model=model_name, what=what, alternative=alternative))

    ac = config.activation_checkpoint
    missing = next(filter(None, (_ac_missing(p, ac) for p in parts)), None) \
        if ac.mode != "none" else None
    if missing:
        refuse(f"activation checkpointing to {missing}, but [activation_checkpoint] mode = "
               f"{ac.mode!r}" + (f" (selective_ac_option = {ac.selective_ac_option!r})"
                                 if ac.mode == "selective" else ""), 'set mode = "none"')
    missing = next(filter(None, (_compile_missing(p) for p in parts)), None) \
        if config.compile.compiles_blocks else None
    if missing:
        refuse(f"torch.compile to {missing}, but [compile] enable = true with components "
               "including \"model\"", "set [compile] enable = false")
    if parallel_dims.tp_enabled:
        missed = [name for part in parts for name, p in part.named_parameters()
                  if not _on_tp_mesh(p)]
        if missed:
            refuse(f"tensor parallelism to {len(missed)} parameter(s) (e.g. {missed[0]}), but "
                   f"[parallelism] tensor_parallel_degree = {parallel_dims.tp} (shard them, or "
                   "declare them replicated with tp_styles.NoParallel)",
                   "set tensor_parallel_degree = 1")
    if parallel_dims.fsdp_enabled:
        unsynced = _unsynchronised(parts, parallel_dims)
        if unsynced:
            name, covered = unsynced[0]
            ranks = parallel_dims.dp * parallel_dims.cp
            refuse(f"FSDP/HSDP to {len(unsynced)} parameter(s) (e.g. {name}, sharded or "
                   f"replicated over {covered} of the {ranks} data-parallel ranks: "
                   "dp_replicate x dp_shard x cp), so each rank would train its own replica",
                   "run without data parallelism (data_parallel_shard_degree, "
                   "data_parallel_replicate_degree and context_parallel_degree = 1)")


def check_logits(logits: torch.Tensor, loss_parallel: bool, model_name: str) -> None:
    """ConfigError if the logits reaching the loss are not what the recorded loss parallel
    setting says: vocab-sharded DTensors under loss parallel, whole ones otherwise."""
    sharded = isinstance(logits, DTensor) and any(
        p.is_shard() and p.dim in (-1, logits.ndim - 1) for p in logits.placements)
    if sharded == loss_parallel:
        return
    if loss_parallel:
        raise ConfigError(
            f"model {model_name!r}: the loss received whole logits under tensor parallelism, "
            "but loss parallel is on ([parallelism] disable_loss_parallel = false): declare "
            "ModelSpec(loss_parallel=False) if the plan gathers them on purpose (loss parallel "
            "is then recorded as off), or keep the head's output vocab-sharded "
            "(ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))")
    raise ConfigError(
        f"model {model_name!r}: the loss received vocab-sharded logits, but loss parallel is "
        "off; the plan must gather them (output_layouts=Replicate()) when "
        "parallel_dims.loss_parallel_enabled is False")


def checked_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 model_name: str, loss_parallel: bool
                 ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``loss_fn`` that first checks its logits (``check_logits``): a type test per
    microbatch, nothing on the tensors."""
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_logits(logits, loss_parallel, model_name)
        return loss_fn(logits, labels)

    return loss
