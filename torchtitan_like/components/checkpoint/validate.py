"""Start-up checks of the [checkpoint] settings, and the error every checkpoint failure raises."""

from __future__ import annotations

import json
from pathlib import Path

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be saved or loaded; the message says why and what to do."""


class CheckpointDamaged(CheckpointError):
    """A checkpoint (``path``) whose files are not what its save wrote (missing, truncated,
    bytes that fail their checksum): ``[checkpoint] fallback_on_damage`` may resume from an
    earlier one."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(message)
        self.path = path


def validate_checkpoint(config: JobConfig, world_size: int) -> None:
    """ConfigError for every [checkpoint] setting that cannot work, before anything starts (a
    setting whose switch is off is one without effect: config/switches.py)."""
    c = config.checkpoint

    def require(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(f"[checkpoint] {message}")

    require(c.interval >= 1, f"interval = {c.interval}: must be >= 1")
    require(c.keep_latest_k >= 0, f"keep_latest_k = {c.keep_latest_k}: must be >= 0 (0 = all)")
    require(c.load_step >= -1, f"load_step = {c.load_step}: must be a step >= 0, or -1 (latest)")
    require(bool(c.folder.strip()), "folder: must not be empty")
    require(c.load_step == -1 or not c.enable or not config.job.overwrite
            or config.fault_tolerance.enable,
            f"load_step = {c.load_step} resumes a run, but [job] overwrite = true starts a fresh "
            "one (the folder's checkpoints are archived first): set only one of them")
    if c.create_seed_checkpoint:  # a different job, not a setting: refused without enable
        require(c.enable, "create_seed_checkpoint needs enable = true (it saves the initial "
                "weights and exits; without checkpoints the job would train instead)")
        require(world_size == 1, f"create_seed_checkpoint runs in one process (the seed must "
                f"not depend on a layout), not {world_size}: run it with NPROC=1")
    if c.initial_load_path:
        path = Path(c.initial_load_path)
        if c.initial_load_in_hf:
            from torchtitan_like.models.registry import get_model_spec

            require(get_model_spec(config.model.name).hf_adapter is not None,
                    f"initial_load_in_hf: model {config.model.name!r} has no HuggingFace adapter")
            require((path / "config.json").is_file() and any(path.glob("*.safetensors")),
                    f"initial_load_path = {path}: no config.json and *.safetensors there "
                    "(a HuggingFace model folder is expected with initial_load_in_hf)")
            _check_hf_config(config, path)
        else:
            require((path / ".metadata").is_file(),
                    f"initial_load_path = {path}: no DCP checkpoint there (no .metadata file); "
                    "for a HuggingFace folder set initial_load_in_hf = true")


def _check_hf_config(config: JobConfig, path: Path) -> None:
    """The HF folder's config.json describes the job's model flavor, or one error naming
    every field that differs (before any process group starts)."""
    from torchtitan_like.models.registry import model_spec_and_args

    spec, args = model_spec_and_args(config)
    try:
        spec.hf_adapter(args).check_config(json.loads((path / "config.json").read_text()))
    except (OSError, ValueError) as e:
        raise ConfigError(f"[checkpoint] initial_load_path = {path}: {e}") from None
