"""Dependent settings: which config fields act only while a parent switch is on, in one table.

**The rule, for every section.** A field set away from its default whose parent is off cannot
take effect; it is not refused (an ablation sweep toggles a parent, ``[float8] enable``, and
keeps its children, ``recipe_name``), but every such field is named in one warning line at
start-up, after the run summary (components/run_summary.py). Settings that would both act and
contradict each other are refused with a ``config error:`` line by the check of their section
(e.g. ``[model] overrides.max_seq_len`` below ``[training] seq_len``, models/registry.py; a
float8 all-gather with row-wise scales). Three fields are refused although their parent is
off: ``[checkpoint] create_seed_checkpoint`` asks for a different job (save the initial weights
and exit), which without checkpoints would train instead; ``[training] dataset_path`` and
``mixture`` name the data to train on, which another dataset would replace
(components/data/checks.py).

``PARENTS`` maps each dependent field to its parent; ``INDEPENDENT`` lists every other field
of every section, switches included, so that a new field must be placed in one of them
(tests/unit/test_switches.py). A parent is a label, as the user reads it, and a test of the
config and of what was built (``Built``: the world size, whether FSDP wraps the model,
whether float8 converts it), never a mutation of the config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torchtitan_like.config.derived import optimizer_state_dtype
from torchtitan_like.config.job_config import JobConfig


@dataclasses.dataclass(frozen=True)
class Built:
    """What a parent may depend on beyond the config's own fields."""

    world_size: int = 1
    fsdp: bool = False
    """FSDP/HSDP wraps the model (distributed/parallel_dims.py: ParallelDims.fsdp_enabled)."""
    float8: bool = False
    """Float8 linears: [float8] enable or "float8" in [model] converters."""


@dataclasses.dataclass(frozen=True)
class Parent:
    label: str
    """The parent as the user reads it, e.g. "[checkpoint] enable"."""
    on: Callable[[JobConfig, Built], bool]
    """Whether the parent is on, i.e. its children take effect."""


def _switch(section: str, name: str) -> Parent:
    return Parent(f"[{section}] {name}", lambda c, b: bool(getattr(getattr(c, section), name)))


CHECKPOINT = _switch("checkpoint", "enable")
PP = Parent("[parallelism] pipeline_parallel_degree > 1",
            lambda c, b: c.parallelism.pipeline_parallel_degree > 1)
CP = Parent("[parallelism] context_parallel_degree > 1",
            lambda c, b: c.parallelism.context_parallel_degree > 1)
TP = Parent("[parallelism] tensor_parallel_degree > 1",
            lambda c, b: c.parallelism.tensor_parallel_degree > 1)
FSDP = Parent("FSDP (data_parallel_shard_degree x context_parallel_degree x "
              "data_parallel_replicate_degree > 1)", lambda c, b: b.fsdp)
FLOAT8 = Parent("[float8] enable", lambda c, b: b.float8)
FLOAT8_FSDP = Parent("[float8] enable under FSDP", lambda c, b: b.float8 and b.fsdp)
PROFILING = _switch("profiling", "enable_profiling")
SNAPSHOT = _switch("profiling", "enable_memory_snapshot")
WANDB = _switch("metrics", "enable_wandb")
MLFLOW = _switch("metrics", "enable_mlflow")
VALIDATION = _switch("validation", "enable")
FAULT_TOLERANCE = _switch("fault_tolerance", "enable")
FAULT = Parent("[debug] fault_rank >= 0", lambda c, b: c.debug.fault_rank >= 0)
SPIKE = Parent('[spike] policy other than "off"', lambda c, b: c.spike.policy != "off")
MUON = Parent('[optimizer] name = "Muon"', lambda c, b: c.optimizer.name == "Muon")


def _dataset(*readers: str) -> Parent:
    return Parent("[training] dataset = " + " or ".join(f'"{r}"' for r in readers),
                  lambda c, b: c.training.dataset in readers)


PARENTS: dict[tuple[str, str], Parent] = {
    ("optimizer", "state_stochastic_rounding"): Parent(
        '[optimizer] state_dtype = "bfloat16"',
        lambda c, b: optimizer_state_dtype(c.optimizer) == "bfloat16"),
    **dict.fromkeys([("lr_scheduler", "decay_type"), ("lr_scheduler", "min_lr_factor")], Parent(
        "[lr_scheduler] decay_ratio != 0 (a decay phase)",
        lambda c, b: c.lr_scheduler.decay_ratio != 0)),
    ("training", "dataset_path"): _dataset("local", "tokenized"),
    ("training", "dataset_text_field"): _dataset("local"),
    ("training", "decode_errors"): _dataset("local"),
    ("training", "mixture"): _dataset("tokenized"),
    ("training", "shuffle"): _dataset("tokenized"),
    ("training", "num_workers"): _dataset("tokenized"),
    ("training", "mixed_precision_reduce"): FSDP,
    ("parallelism", "fsdp_reshard_after_forward"): FSDP,
    ("parallelism", "disable_loss_parallel"): TP,
    ("parallelism", "enable_async_tensor_parallel"): Parent(
        '[parallelism] tensor_parallel_degree > 1 with [compile] enable and "model" in '
        "[compile] components",
        lambda c, b: c.parallelism.tensor_parallel_degree > 1 and c.compile.compiles_blocks),
    **dict.fromkeys([("parallelism", f"context_parallel_{name}")
                     for name in ("rotate_method", "load_balancer")], CP),
    **dict.fromkeys([("parallelism", f"pipeline_parallel_{name}") for name in (
        "schedule", "microbatch_size", "stages_per_rank", "embedding_weight", "output_weight",
        "module_fqns_per_stage")], PP),
    ("activation_checkpoint", "selective_ac_option"): Parent(
        '[activation_checkpoint] mode = "selective"',
        lambda c, b: c.activation_checkpoint.mode == "selective"),
    ("compile", "components"): _switch("compile", "enable"),
    ("compile", "cache_dir"): _switch("compile", "enable"),
    **{("checkpoint", name): CHECKPOINT for name in (
        "interval", "async_mode", "keep_latest_k", "load_step", "exclude_from_loading",
        "last_save_model_only", "last_save_in_hf", "create_seed_checkpoint",
        "fallback_on_damage")},
    ("checkpoint", "export_dtype"): Parent(
        "[checkpoint] last_save_model_only or last_save_in_hf (with enable)",
        lambda c, b: c.checkpoint.enable and (c.checkpoint.last_save_model_only
                                              or c.checkpoint.last_save_in_hf)),
    ("checkpoint", "initial_load_in_hf"): _switch("checkpoint", "initial_load_path"),
    ("float8", "recipe_name"): FLOAT8,
    ("float8", "filter_fqns"): FLOAT8,
    ("float8", "enable_fsdp_float8_all_gather"): FLOAT8_FSDP,
    ("float8", "precompute_float8_dynamic_scale_for_fsdp"): Parent(
        "[float8] enable_fsdp_float8_all_gather (with float8, under FSDP)",
        lambda c, b: b.float8 and b.fsdp and c.float8.enable_fsdp_float8_all_gather),
    ("float8", "emulate"): Parent(
        '[float8] enable or [float8] moe_grouped_mm other than "none"',
        lambda c, b: b.float8 or c.float8.moe_grouped_mm != "none"),
    **{("profiling", name): PROFILING for name in (
        "save_traces_folder", "profiler_warmup", "profiler_active")},
    ("profiling", "profile_freq"): Parent(
        "[profiling] enable_profiling or enable_memory_snapshot",
        lambda c, b: c.profiling.enable_profiling or c.profiling.enable_memory_snapshot),
    ("profiling", "save_memory_snapshot_folder"): SNAPSHOT,
    ("metrics", "wandb_entity"): WANDB,
    ("metrics", "mlflow_tracking_uri"): MLFLOW,
    **dict.fromkeys([("metrics", "project"), ("metrics", "run_name")], Parent(
        "[metrics] enable_wandb or enable_mlflow",
        lambda c, b: c.metrics.enable_wandb or c.metrics.enable_mlflow)),
    ("metrics", "straggler_threshold"): Parent("more than one rank",
                                               lambda c, b: b.world_size > 1),
    ("validation", "freq"): VALIDATION,
    ("validation", "steps"): VALIDATION,
    ("spike", "factor"): SPIKE,
    ("spike", "window"): SPIKE,
    ("spike", "max_consecutive"): Parent('[spike] policy = "stop"',
                                         lambda c, b: c.spike.policy == "stop"),
    ("debug", "fault_step"): FAULT,
    ("debug", "fault_point"): FAULT,
    ("debug", "spike_scale"): Parent("[debug] spike_step > 0", lambda c, b: c.debug.spike_step > 0),
    ("debug", "slow_rank_seconds"): Parent("[debug] slow_rank >= 0",
                                           lambda c, b: c.debug.slow_rank >= 0),
    **{("fault_tolerance", name): FAULT_TOLERANCE for name in (
        "replica_id", "group_size", "min_replica_size", "process_group",
        "process_group_timeout_ms", "manager_hostname")},
    **{("muon", name): MUON for name in (
        "lr", "momentum", "nesterov", "ns_steps", "ns_dtype", "weight_decay", "adjust_lr_fn")},
}
"""Dependent field (section, name) -> its parent."""

INDEPENDENT: dict[str, tuple[str, ...]] = {
    "job": ("config_file", "dump_folder", "description", "custom_import", "overwrite", "trainer"),
    "model": ("name", "flavor", "tokenizer_path", "converters", "overrides", "attn_mask_type"),
    "optimizer": ("name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation",
                  "state_dtype"),
    "lr_scheduler": ("warmup_steps", "decay_ratio"),
    "training": ("dataset", "holdout_every", "local_batch_size", "global_batch_size", "seq_len",
                 "steps", "max_norm", "dtype", "mixed_precision_param"),
    "parallelism": ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "tensor_parallel_degree", "context_parallel_degree",
                    "expert_parallel_degree", "expert_tensor_parallel_degree",
                    "pipeline_parallel_degree"),
    "activation_checkpoint": ("mode",),
    "compile": ("enable",),
    "checkpoint": ("enable", "folder", "initial_load_path"),
    "float8": ("enable", "moe_grouped_mm"),
    "profiling": ("enable_profiling", "enable_memory_snapshot"),
    "metrics": ("log_freq", "enable_tensorboard", "save_tb_folder", "peak_tflops",
                "enable_wandb", "enable_mlflow"),
    "comm": ("init_timeout_seconds", "train_timeout_seconds"),
    "validation": ("enable",),
    "spike": ("policy",),
    "debug": ("seed", "deterministic", "fault_rank", "spike_step", "slow_rank"),
    "fault_tolerance": ("enable",),
}
"""Section -> the fields that act whatever else is set: the switches themselves, and fields
every job reads ([checkpoint] folder and [metrics] save_tb_folder too: a fresh run looks
there for another run's checkpoints and events, components/run_folder.py; [parallelism]
expert_tensor_parallel_degree splits experts under TP with or without EP)."""


def without_effect(config: JobConfig, built: Built) -> list[tuple[str, str, Any, str]]:
    """(section, field, value, parent label) of every field set away from its default whose
    parent is off, in table order."""
    defaults = JobConfig()
    return [(section, name, value, parent.label)
            for (section, name), parent in PARENTS.items()
            if (value := getattr(getattr(config, section), name))
            != getattr(getattr(defaults, section), name) and not parent.on(config, built)]
