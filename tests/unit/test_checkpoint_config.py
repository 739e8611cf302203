"""Every [checkpoint] and fault-injection setting that cannot work fails at parse time, with a
message naming the field and the fix."""

from pathlib import Path

import pytest

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import help_text
from torchtitan_like.validate import parse_args

ROOT = Path(__file__).resolve().parents[2]
ON = ["--checkpoint.enable", "true"]


def parse(*overrides: str, world_size: int = 1):
    return parse_args(["--model.flavor", "tiny", "--training.steps", "10", *overrides], world_size)


@pytest.mark.parametrize(("overrides", "world_size", "message"), [
    ([*ON, "--checkpoint.interval", "0"], 1, r"\[checkpoint\] interval = 0: must be >= 1"),
    ([*ON, "--checkpoint.keep_latest_k", "-1"], 1, r"keep_latest_k = -1: must be >= 0"),
    ([*ON, "--checkpoint.load_step", "-2"], 1, r"load_step = -2: must be a step >= 0, or -1"),
    ([*ON, "--checkpoint.folder", " "], 1, r"\[checkpoint\] folder: must not be empty"),
    (["--checkpoint.create_seed_checkpoint", "true"], 1,
     r"create_seed_checkpoint needs enable = true"),
    ([*ON, "--checkpoint.create_seed_checkpoint", "true"], 2,
     r"create_seed_checkpoint runs in one process .* not 2: run it with NPROC=1"),
    (["--checkpoint.initial_load_path", "/nonexistent"], 1,
     r"initial_load_path = /nonexistent: no DCP checkpoint there .*initial_load_in_hf = true"),
    (["--checkpoint.initial_load_path", "/nonexistent", "--checkpoint.initial_load_in_hf",
      "true"], 1, r"no config.json and \*.safetensors there"),
    (["--checkpoint.async_mode", "async_pinned"], 1,
     r"expected one of 'disabled', 'async', 'async_with_pinned_mem'; did you mean "
     r"'async_with_pinned_mem'"),
    (["--checkpoint.exclude_from_loading", "model,optimiser"], 1,
     r"got 'optimiser', expected one of .*did you mean 'optimizer'"),
    (["--debug.fault_rank", "2"], 2,
     r"\[debug\] fault_rank = 2: must be -1 \(off\) or a rank in 0..1"),
    (["--debug.fault_rank", "0"], 1, r"fault_step = 0: must be a step in 1..10"),
    (["--debug.fault_rank", "0", "--debug.fault_step", "11"], 1, r"fault_step = 11"),
    (["--debug.fault_rank", "0", "--debug.fault_step", "3", "--debug.fault_point", "save"], 1,
     r"no checkpoint is saved at that step; set \[checkpoint\] enable = true"),
    ([*ON, "--checkpoint.interval", "4", "--debug.fault_rank", "0", "--debug.fault_step", "6",
      "--debug.fault_point", "save"], 1, r"a multiple of \[checkpoint\] interval \(4\)"),
])
def test_config_errors(overrides, world_size, message):
    with pytest.raises(ConfigError, match=message):
        parse(*overrides, world_size=world_size)


def test_hf_needs_an_adapter(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="model 'tiny_gpt' has no HuggingFace adapter"):
        parse_args(["--job.custom_import", str(ROOT / "examples/custom_model/tiny_gpt.py"),
                    "--model.name", "tiny_gpt", "--model.flavor", "small",
                    "--checkpoint.initial_load_path", str(tmp_path),
                    "--checkpoint.initial_load_in_hf", "true"], 1)


def test_valid_settings_parse():
    config = parse(*ON, "--checkpoint.async_mode", "async_with_pinned_mem",
                   "--checkpoint.exclude_from_loading", "dataloader,lr_scheduler",
                   "--checkpoint.last_save_model_only", "true",
                   "--checkpoint.export_dtype", "bfloat16",
                   "--checkpoint.interval", "5", "--debug.fault_rank", "1",
                   "--debug.fault_step", "10", "--debug.fault_point", "save", world_size=2)
    assert config.checkpoint.exclude_from_loading == ["dataloader", "lr_scheduler"]
    assert config.debug.fault_point == "save"


def test_every_new_field_is_documented():
    text = help_text()
    for field in ("enable", "folder", "interval", "async_mode", "keep_latest_k", "load_step",
                  "exclude_from_loading", "last_save_model_only", "export_dtype",
                  "create_seed_checkpoint", "initial_load_path", "initial_load_in_hf"):
        line = text.split(f"--checkpoint.{field} ")[1].split("\n")[1]
        assert line.strip(), field
    for field in ("fault_rank", "fault_step", "fault_point"):
        assert text.split(f"--debug.{field} ")[1].split("\n")[1].strip(), field
