"""A TorchTitan config moves over in one run: every key spelled differently here or not
supported gets its specific hint, all in one error; the docs carry the same table."""

from pathlib import Path

import pytest

from torchtitan_like.config import torchtitan_keys
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.validate import parse_args

ROOT = Path(__file__).parents[2]
TORCHTITAN_TOML = ROOT / "tests/assets/torchtitan_debug_model.toml"


def test_torchtitan_debug_model_toml_lists_every_change_in_one_error():
    with pytest.raises(ConfigError) as error:
        parse_args(["--job.config_file", str(TORCHTITAN_TOML)], 1)
    message = str(error.value)
    expected = [
        "TorchTitan's [job] print_args is --print_config",
        "TorchTitan's [job] use_for_integration_test is not supported, because",
        "TorchTitan's [metrics] disable_color_printing is not supported",
        "TorchTitan's [model] hf_assets_path is [model] tokenizer_path",
        "TorchTitan's C4 datasets need a download",
        "TorchTitan's [training] gc_freq is not supported",
        "TorchTitan's [checkpoint] enable_checkpoint is [checkpoint] enable",
        "TorchTitan's [validation] dataset is [training] holdout_every",
    ]
    for hint in expected:
        assert hint in message, hint
    assert message.startswith(f"{len(expected)} problems:")
    assert "last_save_in_hf" not in message  # a real key here
    assert "enable_wandb" not in message  # TorchTitan's key, supported (components/trackers.py)
    assert "create_seed_checkpoint" not in message  # the old, wrong did-you-mean


def test_moved_keys_of_older_configs_point_to_their_new_place():
    with pytest.raises(ConfigError) as error:
        parse_args(["--training.batch_size=4", "--experimental.context_parallel_degree=2",
                    "--float8.enable_float8_linear", "--checkpoint.model_weights_only"], 1)
    message = str(error.value)
    assert "TorchTitan's [training] batch_size is [training] local_batch_size" in message
    assert ("TorchTitan's [experimental] context_parallel_degree is [parallelism] "
            "context_parallel_degree") in message
    assert "TorchTitan's [float8] enable_float8_linear is [float8] enable" in message
    assert "is [checkpoint] last_save_model_only" in message


def test_the_migration_guide_lists_every_hinted_key():
    guide = (ROOT / "docs/migrating-from-torchtitan.md").read_text()
    for name in [*torchtitan_keys.RENAMED, *torchtitan_keys.UNSUPPORTED]:
        section, _, key = name.partition(".")
        spelled = f"`[{section}] {key}`" if key else f"`[{section}]`"
        assert spelled in guide, f"{spelled} missing from docs/migrating-from-torchtitan.md"
