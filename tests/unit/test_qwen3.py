"""Qwen3 flavors: the published shapes, counted as transformers counts them; FLOPs from active
parameters; layouts Qwen3 cannot run are refused with one clear error."""

import json
from pathlib import Path

import pytest
import torch
from qwen3_shapes import hf_config

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.models.qwen3 import Qwen3HFAdapter, Qwen3Model, qwen3_flavors
from torchtitan_like.validate import parse_args

CONFIGS = Path(__file__).resolve().parents[2] / "train_configs"

transformers = pytest.importorskip("transformers", reason="the counts are checked against it")


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight is one Parameter


@pytest.mark.parametrize("flavor", qwen3_flavors)
def test_flavor_counts_match_transformers(flavor):
    args = qwen3_flavors[flavor]
    config = hf_config(args)
    cls = transformers.Qwen3ForCausalLM if args.moe is None else transformers.Qwen3MoeForCausalLM
    with torch.device("meta"):
        theirs, ours = cls(config), Qwen3Model(args)
    assert _count(ours) == _count(theirs) == args.num_params()


def test_published_sizes_and_active_flops():
    """Totals round to the published names; the MoE active counts plus the embedding table
    are the published activated sizes (3.3B, 22B)."""
    billions = {n: a.num_params() / 1e9 for n, a in qwen3_flavors.items()}
    assert round(billions["0.6B"], 1) == 0.6 and round(billions["32B"]) == 33
    assert round(billions["30B-A3B"], 1) == 30.5 and round(billions["235B-A22B"]) == 235
    for name, published in (("30B-A3B", 3.3), ("235B-A22B", 22)):
        a = qwen3_flavors[name]
        activated = (a.num_active_params() + a.vocab_size * a.dim) / 1e9
        assert abs(activated - published) / published < 0.03, (name, activated)
        assert a.flops_per_token(4096) == (6 * a.num_active_params()
                                           + 12 * a.n_layers * a.n_heads * a.head_dim * 4096)
    dense = qwen3_flavors["8B"]
    assert dense.num_active_params() == dense.num_params() - dense.vocab_size * dense.dim


def _validate(flavor: str, tp: int = 1, pp: int = 1) -> None:
    config = JobConfig()
    config.model.name, config.model.flavor = "qwen3", flavor
    dims = ParallelDims(pp=pp, dp_replicate=1, dp_shard=1, cp=1, tp=tp, world_size=tp * pp)
    qwen3_flavors[flavor].validate(config, dims)


def test_layouts_qwen3_cannot_run_are_refused():
    _validate("debugmodel_moe", tp=2)  # MoE under TP: experts split over TP (local_tp.py)
    with pytest.raises(ConfigError, match="ties the output head"):
        _validate("0.6B", pp=2)
    with pytest.raises(ConfigError, match="n_kv_heads = 8 is not divisible"):
        _validate("8B", tp=16)
    _validate("8B", tp=8)


def test_sharded_hf_load_of_experts_is_refused():
    config = JobConfig()
    config.model.name, config.model.flavor = "qwen3", "debugmodel_moe"
    config.checkpoint.initial_load_in_hf = True
    dims = ParallelDims(pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=1, world_size=2)
    with pytest.raises(ConfigError, match="convert the folder to a seed checkpoint"):
        qwen3_flavors["debugmodel_moe"].validate(config, dims)


# Qwen/Qwen3-0.6B's config.json as published (transformers 4.51 keys).
PUBLISHED_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}


def test_continue_config_validates_with_the_published_folder(tmp_path, monkeypatch):
    """The shipped continued-pre-training config, at its 8 GPUs, against a folder holding the
    published config.json (the weights file is not read at validation)."""
    (tmp_path / "Qwen3-0.6B").mkdir()
    (tmp_path / "Qwen3-0.6B/config.json").write_text(json.dumps(PUBLISHED_0_6B))
    (tmp_path / "Qwen3-0.6B/model.safetensors").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    config = parse_args(["--job.config_file", str(CONFIGS / "qwen3_0.6b_continue.toml"),
                         "--model.tokenizer_path=", "--training.dataset=cpython_docs",
                         "--training.dataset_path="], 8)
    assert config.checkpoint.initial_load_in_hf and config.model.flavor == "0.6B"
    published = Qwen3HFAdapter(qwen3_flavors["0.6B"])
    with pytest.raises(ValueError, match=r"eps: HF 1e-05, ours 1e-06; hidden_act: HF gelu"):
        published.check_config({**PUBLISHED_0_6B, "hidden_act": "gelu", "rms_norm_eps": 1e-5})
    with pytest.raises(ConfigError, match=r"hidden_size: HF 1024, ours 2048"):
        parse_args(["--job.config_file", str(CONFIGS / "qwen3_0.6b_continue.toml"),
                    "--model.tokenizer_path=", "--training.dataset=cpython_docs",
                    "--training.dataset_path=", "--model.flavor=1.7B"], 8)



def test_expert_parallelism_needs_the_moe_flavor():
    with pytest.raises(ConfigError, match="no mixture-of-experts layers"):
        parse_args(["--model.name", "qwen3", "--model.flavor", "debugmodel",
                    "--parallelism.expert_parallel_degree", "2"], 2)
    parse_args(["--model.name", "qwen3", "--model.flavor", "debugmodel_moe",
                "--parallelism.expert_parallel_degree", "2"], 2)

