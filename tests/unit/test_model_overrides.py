"""[model] overrides: fields of the flavor's args replaced from the TOML or the command line,
type-checked, unknown names refused; every caller of model_spec_and_args sees them."""

import pytest

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import to_toml
from torchtitan_like.models.registry import model_spec_and_args
from torchtitan_like.tools.planner import from_job_config
from torchtitan_like.validate import parse_args

TINY = ["--model.flavor=tiny"]


def args_of(argv):
    return model_spec_and_args(parse_args([*TINY, *argv], 1))[1]


def test_command_line_and_toml_overrides_replace_flavor_fields(tmp_path):
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nflavor = "tiny"\noverrides = { n_layers = 2, norm_eps = 1e-6 }\n')
    args = args_of(["--job.config_file", str(toml)])
    assert (args.n_layers, args.norm_eps, args.dim) == (2, 1e-6, 128)
    args = args_of(["--job.config_file", str(toml), "--model.overrides.n_layers=3",
                    "--model.overrides.n_kv_heads=2"])
    assert (args.n_layers, args.norm_eps, args.kv_heads) == (3, 1e-6, 2)  # the CLI wins
    assert "overrides = { n_layers = 2, norm_eps = 1e-06 }" in to_toml(
        parse_args(["--job.config_file", str(toml)], 1))


@pytest.mark.parametrize(("override", "error"), [
    ("--model.overrides.n_layer=8", r"have no field 'n_layer'; did you mean 'n_layers'"),
    ("--model.overrides.n_layers=eight", r"overrides.n_layers: got 'eight', expected int"),
    ("--model.overrides.rope_scaling=1", r"cannot be overridden"),
])
def test_bad_overrides_are_refused_at_start_up(override, error):
    with pytest.raises(ConfigError, match=error):
        parse_args([*TINY, override], 1)


def test_the_planner_sees_the_override():
    shape, _, _ = from_job_config(parse_args([*TINY, "--model.overrides.n_layers=3"], 1), 1)
    assert shape.n_layers == 3
