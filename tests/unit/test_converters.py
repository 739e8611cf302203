"""Converters by name: ``[model] converters``, the registry, and the float8 switch mapping."""

import pytest
from harness import ROOT, build_trainer
from torch import nn

from torchtitan_like.components.converters import build_converters
from torchtitan_like.components.float8 import Float8Converter
from torchtitan_like.config.derived import float8_enabled, model_converters
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.validate import parse_args

PLUGIN = ["--job.custom_import", str(ROOT / "tests/plugins/eps_converter.py")]
EMULATED = ["--float8.emulate=true"]


@pytest.mark.parametrize("switch", [["--model.converters=float8"], ["--float8.enable=true"]])
def test_float8_by_name_or_by_its_switch_is_one_job(switch):
    config = parse_args([*switch, *EMULATED], 1)
    assert model_converters(config) == ["float8"] and float8_enabled(config)
    # the config is what the user wrote: neither spelling is written into the other
    by_name = switch == ["--model.converters=float8"]
    assert (config.model.converters == ["float8"], config.float8.enable) == (by_name, not by_name)
    converters = build_converters(config, ParallelDims.from_config(config, 1), "cpu")
    assert [type(c) for c in converters.converters] == [Float8Converter]


def test_an_unknown_converter_is_refused_with_the_closest_name():
    with pytest.raises(ConfigError, match=r"unknown converter 'flaot8'.*did you mean 'float8'"):
        parse_args(["--model.converters=flaot8"], 1)
    with pytest.raises(ConfigError, match="twice"):
        parse_args(["--model.converters=float8,float8", *EMULATED], 1)


def test_a_registered_converter_runs_in_order_before_the_plan(corpus, tmp_path,
                                                              one_process_group):
    trainer = build_trainer([*PLUGIN, "--model.converters=norm_eps,float8", *EMULATED,
                             "--training.steps=1"], tmp_path, corpus, one_process_group)
    assert float8_enabled(trainer.config)
    norm_eps, float8 = trainer.converters.converters
    assert isinstance(float8, Float8Converter)
    norms = [m for m in trainer.model_parts[0].modules() if isinstance(m, nn.RMSNorm)]
    assert norms and all(m.eps == 1e-3 for m in norms)
    trainer.train()
    assert norm_eps.steps == 1  # its optimizer hook ran after the step
