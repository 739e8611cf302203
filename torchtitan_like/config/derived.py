"""Values the job derives from its config, where two fields say one thing: computed from what
the user wrote, never written back into it (the ``JobConfig`` a job reads, prints with
``--print_config`` and saves as ``config.toml`` is the TOML and the overrides as given).
"""

from __future__ import annotations

from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.optimization import Optimizer as OptimizerConfig


def model_converters(config: JobConfig) -> list[str]:
    """The model converters the job applies, in order: ``[model] converters`` as listed, then
    "float8" for ``[float8] enable`` and "moe_grouped_mm" for ``[float8] moe_grouped_mm``
    (other than "none"), each when not listed already (components/converters.py)."""
    names = list(config.model.converters)
    for name, on in (("float8", config.float8.enable),
                     ("moe_grouped_mm", config.float8.moe_grouped_mm != "none")):
        if on and name not in names:
            names.append(name)
    return names


def float8_enabled(config: JobConfig) -> bool:
    """Whether the blocks' linears train in float8: ``[float8] enable``, or "float8" listed in
    ``[model] converters`` (two spellings of one switch)."""
    return "float8" in model_converters(config)


def optimizer_state_dtype(config: OptimizerConfig) -> str:
    """The dtype of Adam's moments: ``[optimizer] state_dtype``, or "bfloat16" under TorchTitan's
    ``implementation = "fused_opt_states_bf16"`` (fused AdamW with bf16 moments)."""
    if config.implementation == "fused_opt_states_bf16":
        return "bfloat16"
    return config.state_dtype
