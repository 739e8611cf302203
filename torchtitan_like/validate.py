"""Every check a job can fail before it starts, in one place, run once at start-up, and
``parse_args``, the trainer's front door that reads the config and runs them.

Each check raises ConfigError naming the field(s) and the fix. Nothing here touches a process
group or allocates a model: the world size comes from torchrun's environment. This module sits
above ``config/`` (which imports nothing outside itself) because the checks ask the subsystems
(models, parallelisms, checkpoint, data) whether they can run the job.
"""

from __future__ import annotations

import contextlib

from torchtitan_like.components import (
    blockwise_fp8,
    float8,
    moe_low_precision,
    optimizer,
    profiling,
    versions,
)
from torchtitan_like.components.checkpoint import validate_checkpoint
from torchtitan_like.components.converters import check_converters
from torchtitan_like.components.data.checks import check_data
from torchtitan_like.components.data.tokenized import validate_data_options
from torchtitan_like.components.data.tokenizer import build_tokenizer
from torchtitan_like.components.fault_injection import validate_faults
from torchtitan_like.components.hf_export import validate_hf_export
from torchtitan_like.components.optim.registry import validate_optimizer
from torchtitan_like.components.output_paths import check_output_paths
from torchtitan_like.components.trackers import validate_trackers
from torchtitan_like.config.custom_sections import validate_custom_sections
from torchtitan_like.config.derived import float8_enabled
from torchtitan_like.config.errors import ConfigError, require
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.manager import (
    build_job_config,
    help_text,
    import_custom_modules,
    to_toml,
)
from torchtitan_like.distributed import context_parallel, fault_tolerance, tensor_parallel
from torchtitan_like.distributed.activation_checkpoint import every_nth_layer
from torchtitan_like.distributed.expert_layout import validate_expert_layout
from torchtitan_like.distributed.gpu_check import require_usable_gpus
from torchtitan_like.distributed.layout_rules import accumulation_steps
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.pipeline import validate_pipeline
from torchtitan_like.distributed.utils import device_type
from torchtitan_like.models.attention_masks import check_attn_mask_type
from torchtitan_like.models.registry import check_supported_dims, model_spec_and_args
from torchtitan_like.models.stage_inputs import check_stage_inputs


def grad_accumulation_steps(config: JobConfig, dp_degree: int) -> int:
    """Microbatches per optimizer step on each rank: global / (local x dp), dp counting the
    data-parallel ranks of every replica group under [fault_tolerance]."""
    t = config.training
    _, readers = fault_tolerance.data_share(config, 0, dp_degree)
    return accumulation_steps(t.global_batch_size, t.local_batch_size, readers)


def _validate_numbers(config: JobConfig) -> None:
    """Numbers whose valid values are not one range (simple ranges: ``ranged`` fields)."""
    t, s = config.training, config.lr_scheduler
    require(t.global_batch_size == -1 or t.global_batch_size >= 1,
            f"[training] global_batch_size = {t.global_batch_size}: must be >= 1 or -1")
    require(t.holdout_every >= 0 and t.holdout_every != 1,
            f"[training] holdout_every = {t.holdout_every}: must be 0 (off) or >= 2")
    require(s.decay_ratio == -1 or 0 <= s.decay_ratio <= 1,
            f"[lr_scheduler] decay_ratio = {s.decay_ratio}: must be in [0, 1] or -1")
    if config.validation.enable:
        require(t.holdout_every > 0,
                "[validation] enable needs a held-out split: set [training] holdout_every >= 2")


def validate(config: JobConfig, world_size: int) -> None:
    require_usable_gpus()  # before device_type() below could quietly pick the CPU
    _validate_numbers(config)
    ac = config.activation_checkpoint
    if ac.mode == "selective" and ac.selective_ac_option != "op":
        every_nth_layer(ac.selective_ac_option)
    check_converters(config)
    validate_custom_sections(config)
    versions.check_versions(config, device_type())
    float8.validate(config.float8, float8_enabled(config), device_type())
    optimizer.validate(config.optimizer, config.training.dtype, device_type())
    validate_optimizer(config, device_type())
    profiling.validate(config.profiling, device_type())
    fault_tolerance.validate(config, device_type())
    parallel_dims = ParallelDims.from_config(config, world_size)
    grad_accumulation_steps(config, parallel_dims.dp)
    blockwise_fp8.validate(config, parallel_dims, device_type())
    tensor_parallel.validate(config, parallel_dims)
    spec, args = model_spec_and_args(config)
    check_supported_dims(spec, config)
    check_attn_mask_type(spec, config.model.attn_mask_type)
    check_stage_inputs(spec, config.model.attn_mask_type)
    tensor_parallel.record_loss_parallel(config, parallel_dims, spec.name, spec.loss_parallel)
    validate_expert_layout(parallel_dims, args.num_routed_experts())
    moe_low_precision.validate(config, device_type(), parallel_dims, lambda: spec.model_cls(args))
    context_parallel.validate(config, parallel_dims, spec.context_parallel_buffers is not None)
    if parallel_dims.pp > 1:
        require(spec.pipelining_fn is not None,
                f"[model] name {spec.name!r} has no pipeline split (ModelSpec.pipelining_fn); "
                "set [parallelism] pipeline_parallel_degree = 1")
        validate_pipeline(config)
    args.validate(config, parallel_dims)

    tokenizer = build_tokenizer(config.model.tokenizer_path)
    vocab = getattr(args, "vocab_size", None)
    require(
        vocab is None or tokenizer.vocab_size <= vocab,
        f"the tokenizer has {tokenizer.vocab_size} tokens but [model] flavor "
        f"{config.model.flavor} only {vocab} embeddings; choose a larger flavor or tokenizer",
    )
    validate_data_options(config.training, config.model.tokenizer_path, tokenizer.vocab_size)
    check_data(config.training, config.validation.enable, tokenizer.vocab_size)
    validate_checkpoint(config, world_size)
    validate_hf_export(config)
    check_output_paths(config)
    validate_faults(config, world_size)
    validate_trackers(config)


def parse_args(argv: list[str], world_size: int) -> JobConfig:
    """The trainer's front door: TOML + overrides -> a validated JobConfig.

    Prints --help / --print_config and exits when asked. ``world_size`` is what the degrees
    are checked against (torchrun's WORLD_SIZE, known before any process group exists).
    """
    if "--help" in argv or "-h" in argv:
        with contextlib.suppress(ConfigError):  # imports custom_import (custom sections)
            build_job_config([a for a in argv if a not in ("--help", "-h", "--print_config")])
        print(help_text())
        raise SystemExit(0)
    print_config = "--print_config" in argv
    config = build_job_config([a for a in argv if a != "--print_config"])
    import_custom_modules(config.job.custom_import)
    validate(config, world_size)
    fault_tolerance.place_group(config)
    if print_config:
        print(to_toml(config))
        raise SystemExit(0)
    return config
