"""Every shipped config parses and validates at the world size it is written for.

GPU-only switches are turned off for this CPU (async TP needs CUDA), and what a user supplies
(the 128K config's data, tokenizer and 8K checkpoint; the Qwen3 HF folder, checked in
tests/unit/test_qwen3.py) is replaced by the built-in data and tokenizer and no initial load.
"""

from pathlib import Path

import pytest

from torchtitan_like.components.run_summary import settings_without_effect
from torchtitan_like.config.manager import build_job_config
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.tools.planner.from_config import implied_num_gpus
from torchtitan_like.validate import parse_args

CONFIGS = Path(__file__).resolve().parents[2] / "train_configs"
WORLD_SIZES = {
    "debug_model.toml": 1,
    "deepseek_v3_debug.toml": 1,
    "deepseek_v3_671b.toml": 2048,
    "deepseek_v3_recipe.toml": 16,
    "deepseek_v3_recipe_debug.toml": 2,
    "llama3_8b.toml": 8,
    "llama3_70b.toml": 64,
    "llama3_405b.toml": 16384,
    "llama3_405b_128k.toml": 16384,
    "qwen3_0.6b_continue.toml": 8,
}
ON_THIS_CPU = ["--parallelism.enable_async_tensor_parallel=false", "--model.tokenizer_path=",
               "--training.dataset=cpython_docs", "--training.dataset_path=",
               "--checkpoint.initial_load_path=",
               "--checkpoint.initial_load_in_hf=false"]


def test_every_shipped_config_is_listed():
    assert sorted(p.name for p in CONFIGS.glob("*.toml")) == sorted(WORLD_SIZES)


@pytest.mark.parametrize("name", WORLD_SIZES)
def test_shipped_config_validates(name):
    """... and sets nothing without effect (config/switches.py)."""
    config = parse_args(["--job.config_file", str(CONFIGS / name), *ON_THIS_CPU],
                        WORLD_SIZES[name])
    assert config.job.description
    dims = ParallelDims.from_config(config, WORLD_SIZES[name])
    assert settings_without_effect(config, dims) is None


@pytest.mark.parametrize("name", WORLD_SIZES)
def test_a_config_for_more_than_one_node_states_its_size_in_its_degrees(name):
    """``ttl-plan --config`` plans a config on the GPUs its degrees multiply to; one written
    for a single node may leave them to the launcher (data_parallel_shard_degree = -1)."""
    implied = implied_num_gpus(build_job_config(["--job.config_file", str(CONFIGS / name)]))
    assert implied == WORLD_SIZES[name] or (implied is None and WORLD_SIZES[name] <= 8)


def test_the_405b_layouts_are_the_llama3_papers():
    p = parse_args(["--job.config_file", str(CONFIGS / "llama3_405b_128k.toml"), *ON_THIS_CPU],
                   16384).parallelism
    assert (p.tensor_parallel_degree, p.context_parallel_degree, p.pipeline_parallel_degree,
            p.data_parallel_shard_degree) == (8, 16, 16, 8)


def test_the_671b_layout_is_deepseek_v3s():
    """2,048 GPUs = PP 16 x 128 data-parallel ranks, EP 64 borrowed from them, no TP."""
    p = parse_args(["--job.config_file", str(CONFIGS / "deepseek_v3_671b.toml"), *ON_THIS_CPU],
                   2048).parallelism
    assert (p.pipeline_parallel_degree, p.expert_parallel_degree, p.tensor_parallel_degree,
            p.data_parallel_shard_degree) == (16, 64, 1, 128)


@pytest.mark.parametrize("name, world_size", [("deepseek_v3_recipe.toml", 16),
                                              ("deepseek_v3_recipe_debug.toml", 2)])
def test_the_recipe_configs_turn_on_deepseek_v3s_recipe(name, world_size):
    """Blockwise FP8, bf16 moments, one MTP depth and expert parallelism, all at once."""
    config = parse_args(["--job.config_file", str(CONFIGS / name), *ON_THIS_CPU], world_size)
    assert (config.float8.enable, config.float8.recipe_name) == (True, "blockwise")
    assert config.optimizer.state_dtype == "bfloat16"
    assert config.model.overrides["mtp_depth"] == 1
    assert config.parallelism.expert_parallel_degree > 1
