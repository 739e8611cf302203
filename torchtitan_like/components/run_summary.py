"""The block a job logs once at start-up: what it is, read from what was actually built.

Every line is counted on the model parts after the plan ran (not read back from the config),
so a switch that did not take effect shows: the layout with every degree (EP and ETP included),
per parallel dimension what was applied (TP with sequence and loss parallel, FSDP/HSDP units,
PP stages, CP, EP), activation checkpointing (mode, blocks wrapped), compiled blocks, Float8
linears, the data and tokenizer, and the memory this rank's weights, gradients and optimizer
states take (exact: the local shards' sizes; activations come on top, which ``ttl-plan``
models per layout).
"""

from __future__ import annotations

import json

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import FSDPModule

from torchtitan_like.config.derived import float8_enabled
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.switches import Built, without_effect
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.plan_check import _compiled
from torchtitan_like.distributed.tensor_parallel import async_tp_on
from torchtitan_like.distributed.utils import local_numel
from torchtitan_like.models.registry import overridden_max_seq_len

ADAM_STATES = 2
"""AdamW and Adam keep two moments per parameter, in the master dtype."""


def _count(parts: list[nn.Module], test) -> int:
    return sum(1 for part in parts for module in part.modules() if test(module))


def _layout(dims: ParallelDims) -> str:
    return (f"pp {dims.pp} x dp_replicate {dims.dp_replicate} x dp_shard {dims.dp_shard} x "
            f"cp {dims.cp} x tp {dims.tp} = {dims.world_size} ranks; ep {dims.ep}, etp "
            f"{dims.etp}")


def _parallel_lines(config: JobConfig, dims: ParallelDims, parts: list[nn.Module]) -> list[str]:
    p = config.parallelism
    fsdp_units = _count(parts, lambda m: isinstance(m, FSDPModule))
    lines = [
        "TP: off" if not dims.tp_enabled else (
            f"TP {dims.tp}: sequence parallel, loss parallel "
            f"{'on' if dims.loss_parallel_enabled else 'off'}, async TP "
            f"{'on' if async_tp_on(config) else 'off'}"),
        "FSDP: off" if not dims.fsdp_enabled else (
            f"{'HSDP' if dims.dp_replicate > 1 else 'FSDP'}: {fsdp_units} units, shards over "
            f"{dims.dp_shard * dims.cp} ranks, reshard after forward "
            f"{p.fsdp_reshard_after_forward}"),
        "PP: off" if dims.pp == 1 else (
            f"PP {dims.pp}: {p.pipeline_parallel_schedule}, {len(parts)} stage(s) on this rank"),
        "CP: off" if not dims.cp_enabled else (
            f"CP {dims.cp}: {p.context_parallel_rotate_method} rotation, "
            f"{p.context_parallel_load_balancer} load balancer"),
        "EP: off" if not dims.ep_enabled else f"EP {dims.ep}, ETP {dims.etp}",
    ]
    return lines


def _model_lines(config: JobConfig, parts: list[nn.Module]) -> list[str]:
    ac = config.activation_checkpoint
    blocks = sum(len(getattr(part, "layers", ())) for part in parts)
    wrapped = _count(parts, lambda m: isinstance(m, CheckpointWrapper))
    mode = ac.mode if ac.mode != "selective" else f"selective {ac.selective_ac_option}"
    compiled = _count(parts, _compiled)
    float8 = _count(parts, lambda m: type(m).__name__ == "Float8Linear")
    return [
        "activation checkpointing: off" if ac.mode == "none" else
        f"activation checkpointing: {mode}, {wrapped} module(s) wrapped"
        + (f" of {blocks} blocks" if blocks else ""),
        f"compile: {compiled} compiled module(s)" if config.compile.enable else "compile: off",
        f"float8: {float8} linears converted ({config.float8.recipe_name})"
        if float8 else "float8: off",
    ]


def state_bytes(config: JobConfig, parts: list[nn.Module]) -> int:
    """This rank's weights, gradients (same dtype) and Adam moments, in bytes."""
    numel = local_numel(p for part in parts for p in part.parameters())
    master = DTYPES[config.training.dtype].itemsize
    return numel * master * (2 + ADAM_STATES)


def describe_run(config: JobConfig, dims: ParallelDims, parts: list[nn.Module], data: str) -> str:
    """The start-up block: one line per fact, indented under a title."""
    gib = state_bytes(config, parts) / 2**30
    lines = [
        f"layout: {_layout(dims)}",
        *_parallel_lines(config, dims, parts),
        *_model_lines(config, parts),
        f"data: {data}",
        f"memory on this rank: {gib:.3f} GiB of weights, gradients and optimizer states "
        f"({config.training.dtype}); activations on top (ttl-plan estimates the peak)",
    ]
    return f"run: {config.job.description}\n" + "\n".join(f"  {line}" for line in lines)


def settings_without_effect(config: JobConfig, dims: ParallelDims) -> str | None:
    """The one warning line after the summary: every setting whose parent switch is off
    (config/switches.py), and a ``[model] overrides.max_seq_len`` above ``[training] seq_len``
    (models/registry.py); None when there is none."""
    built = Built(world_size=dims.world_size, fsdp=dims.fsdp_enabled, float8=float8_enabled(config))
    items = [f"[{section}] {name} = {json.dumps(value)} ({parent} is off)"
             for section, name, value, parent in without_effect(config, built)]
    rows, seq_len = overridden_max_seq_len(config), config.training.seq_len
    if rows is not None and rows > seq_len:
        items.append(f"[model] overrides.max_seq_len = {rows} (the RoPE table is [training] "
                     f"seq_len = {seq_len} long)")
    if not items:
        return None
    return (f"{len(items)} setting(s) without effect, kept for a sweep that turns their switch "
            "on: " + "; ".join(items))
