"""ModelSpec.supported_dims: a job asking for a dimension the model's plan does not implement is
refused while the config is parsed, before any process group exists."""

import dataclasses

import pytest
from harness import ROOT

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.models.registry import check_supported_dims, get_model_spec
from torchtitan_like.validate import parse_args

TINY_GPT = ["--job.custom_import", str(ROOT / "examples/custom_model/tiny_gpt.py"),
            "--model.name", "tiny_gpt", "--model.flavor", "small",
            "--training.local_batch_size=2", "--training.global_batch_size=2"]


def test_the_example_refuses_what_it_does_not_declare():
    # (CP is refused by its own check too, after this one: no context_parallel_buffers.)
    with pytest.raises(ConfigError, match=r"\[parallelism\] context_parallel_degree = 2, but "
                       r"model 'tiny_gpt' supports only data parallelism and \[pp, tp\]"):
        parse_args([*TINY_GPT, "--parallelism.context_parallel_degree=2"], 2)


def test_the_example_runs_data_parallel_and_llama_declares_every_dim():
    parse_args([*TINY_GPT, "--training.global_batch_size=4"], 2)
    assert get_model_spec("llama3").supported_dims == {"tp", "cp", "pp", "ep"}


def test_an_unknown_dimension_name_is_refused():
    spec = dataclasses.replace(get_model_spec("llama3"), supported_dims=frozenset({"sp"}))
    config = parse_args([], 1)
    with pytest.raises(ConfigError, match=r"unknown \['sp'\]"):
        check_supported_dims(spec, config)
