"""After a model's plan ran: did what the config asked for take effect?

A custom plan (``ModelSpec.parallelize_fn``) that forgets a step would otherwise train
something else without a word: no activation checkpointing under ``mode = "full"`` (an
ablation then reports identical variants), eager blocks under ``[compile] enable``, or, under
TP, replicated copies of parameters while throughput is divided by the TP degree as if TP ran.
The trainer calls ``check_plan_applied`` on its model parts right after the plan and stops with
one error naming the model and the switch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.tensor import DTensor

from torchtitan_like.config.errors import ConfigError

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims


def _compiled(module: nn.Module) -> bool:
    """``Module.compile`` compiles in place; ``torch.compile(module)`` wraps it."""
    return (getattr(module, "_compiled_call_impl", None) is not None
            or type(module).__name__ == "OptimizedModule")


def _on_tp_mesh(parameter: nn.Parameter) -> bool:
    """On the TP mesh, or (routed experts) on the expert mesh: its ``etp`` dim under ETP = TP,
    its ``ep`` dim under ETP = 1 (expert parallelism borrowed the TP ranks)."""
    dims = (parameter.device_mesh.mesh_dim_names or ()) if isinstance(parameter, DTensor) else ()
    return bool({"tp", "etp", "ep"} & set(dims))


def check_plan_applied(model_name: str, parts: list[nn.Module], parallel_dims: ParallelDims,
                       config: JobConfig) -> None:
    """Raise ConfigError if a model part lacks what the config switched on."""
    fix = (f"model {model_name!r}: its parallelize_fn (ModelSpec) did not apply {{}}; call "
           "distributed/plan_toolkit.py's apply_block_tail (or the step itself) in the plan, "
           "or {}")
    ac = config.activation_checkpoint
    if ac.mode != "none" and not all(
            any(isinstance(m, CheckpointWrapper) for m in part.modules()) for part in parts):
        raise ConfigError(fix.format(f"activation checkpointing, but [activation_checkpoint] "
                                     f"mode = {ac.mode!r}", "set mode = \"none\""))
    if config.compile.compiles_blocks and not all(
            any(_compiled(m) for m in part.modules()) for part in parts):
        raise ConfigError(fix.format("torch.compile to any block, but [compile] enable = true "
                                     "with components including \"model\"",
                                     "set [compile] enable = false"))
    if parallel_dims.tp_enabled:
        missed = [name for part in parts for name, p in part.named_parameters()
                  if not _on_tp_mesh(p)]
        if missed:
            raise ConfigError(fix.format(
                f"tensor parallelism to {len(missed)} parameter(s) (e.g. {missed[0]}), but "
                f"[parallelism] tensor_parallel_degree = {parallel_dims.tp} (shard them, or "
                "declare them replicated with plan_toolkit.NoParallel)",
                "set tensor_parallel_degree = 1"))
