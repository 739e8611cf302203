"""TorchTitan's TOML keys that are spelled differently here or not supported, with the fix.

A TorchTitan config (v0.1/v0.2 era) mostly reads as is; the keys below do not. Each entry says
what to write instead ("TorchTitan's X is Y here") or why it is not supported, so that moving
a config over takes one run that lists every key to change (config/manager.py reports them all
in one error). ``docs/migrating-from-torchtitan.md`` carries the same table (a test checks it).
Keys are ``section.key``; a bare ``section`` covers a whole section.
"""

from __future__ import annotations

from typing import Any

RENAMED: dict[str, str] = {
    "job.print_args": "--print_config (prints the merged, validated config as TOML and exits)",
    "model.hf_assets_path": "[model] tokenizer_path (a tokenizer.json or its folder); weights "
                            "come from [checkpoint] initial_load_path with initial_load_in_hf",
    "training.batch_size": "[training] local_batch_size",
    "training.compile": "[compile] enable",
    "training.seed": "[debug] seed",
    "training.deterministic": "[debug] deterministic",
    "training.data_parallel_replicate_degree": "[parallelism] data_parallel_replicate_degree",
    "training.data_parallel_shard_degree": "[parallelism] data_parallel_shard_degree",
    "training.tensor_parallel_degree": "[parallelism] tensor_parallel_degree",
    "experimental.context_parallel_degree": "[parallelism] context_parallel_degree",
    "experimental.pipeline_parallel_degree": "[parallelism] pipeline_parallel_degree",
    "experimental.custom_import": "[job] custom_import",
    "experimental.custom_model_path": "[job] custom_import",
    "checkpoint.enable_checkpoint": "[checkpoint] enable",
    "checkpoint.model_weights_only": "[checkpoint] last_save_model_only",
    "float8.enable_float8_linear": "[float8] enable",
    "lr_scheduler.lr_min": "[lr_scheduler] min_lr_factor",
    "parallelism.pipeline_parallel_split_points": "[parallelism] "
        "pipeline_parallel_module_fqns_per_stage (module names per stage, not split points)",
    "parallelism.pipeline_parallel_layers_per_stage": "[parallelism] "
        "pipeline_parallel_module_fqns_per_stage, or the automatic cost-balanced split",
    "validation.dataset": "[training] holdout_every (the held-out split of the training data)",
    "validation.dataset_path": "[training] holdout_every (the held-out split of the training "
                               "data)",
    "validation.seq_len": "[training] seq_len (validation batches are shaped like training's)",
    "validation.local_batch_size": "[training] local_batch_size (validation batches are "
                                   "shaped like training's)",
    "metrics.rank_0_only": "LOG_RANK=0 ./run_train.sh (only rank 0 writes metrics anyway)",
}
"""TorchTitan key -> the key (or switch) that does its job here."""

UNSUPPORTED: dict[str, str] = {
    "job.use_for_integration_test": "TorchTitan's integration-test registry has no counterpart; "
                                    "delete it",
    "metrics.disable_color_printing": "logs are plain text; delete it",
    "metrics.save_for_all_ranks": "rank 0 writes the job's metrics (they are global)",
    "model.norm_type": "the norm is part of the model (llama3: RMSNorm)",
    "model.print_after_conversion": "the start-up log names the parameter count and layout",
    "training.gc_freq": "Python's garbage collector keeps its default schedule",
    "training.enable_cpu_offload": "FSDP CPU offload is not implemented",
    "optimizer.early_step_in_backward": "the optimizer steps once after backward",
    "parallelism.enable_compiled_autograd": "compiled autograd is not wired in",
    "checkpoint.enable_first_step_checkpoint": "use create_seed_checkpoint for the initial "
                                               "weights",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns":
        "selective op AC saves every matmul",
    "comm.trace_buf_size": "NCCL's flight recorder is set by its environment variables "
                           "(TORCH_FR_BUFFER_SIZE)",
    "comm.save_traces_folder": "NCCL's flight recorder is set by its environment variables "
                               "(TORCH_FR_DUMP_TEMP_FILE)",
    "comm.save_traces_file_prefix": "NCCL's flight recorder is set by its environment "
                                    "variables (TORCH_FR_DUMP_TEMP_FILE)",
    "fault_tolerance.semi_sync_method": "semi-synchronous training (LocalSGD, DiLoCo) is not "
                                        "implemented: replica groups synchronise every step",
    "fault_tolerance.sync_steps": "semi-synchronous training (LocalSGD, DiLoCo) is not "
                                  "implemented: replica groups synchronise every step",
    "memory_estimation": "use ttl-plan (ttl-plan --config job.toml for a config's own "
                         "layout), which estimates memory per layout before the run",
    "mx": "MXFP8 linears are not implemented; the routed experts' MXFP8 grouped GEMMs are "
          "[float8] moe_grouped_mm = \"mxfp8\"",
    "quantize": "MX/Float8 have their keys in [float8] (the routed experts' grouped GEMMs: "
                "[float8] moe_grouped_mm)",
}
"""TorchTitan key -> why it has no counterpart here (after "not supported, because ...")."""

_VALUES: dict[tuple[str, str, Any], str] = {
    ("training", "dataset", name): "TorchTitan's C4 datasets need a download and are not "
    "shipped; use cpython_docs, or local with [training] dataset_path"
    for name in ("c4", "c4_test", "c4_validation")
}


def torchtitan_hint(section: str, key: str | None = None) -> str | None:
    """What to write instead of TorchTitan's ``[section] key`` (or whole section), if known."""
    name = section if key is None else f"{section}.{key}"
    if name in RENAMED:
        return f"TorchTitan's {_spell(section, key)} is {RENAMED[name]}"
    if name in UNSUPPORTED:
        return f"TorchTitan's {_spell(section, key)} is not supported, because {UNSUPPORTED[name]}"
    return None


def value_hint(section: str, key: str, value: Any) -> str:
    """``; <hint>`` for a TorchTitan value that this field does not accept, else ``""``."""
    hint = _VALUES.get((section, key, value)) if isinstance(value, str) else None
    return f"; {hint}" if hint else ""


def _spell(section: str, key: str | None) -> str:
    return f"[{section}]" if key is None else f"[{section}] {key}"
