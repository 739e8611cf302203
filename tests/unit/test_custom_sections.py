"""A config section registered by a custom_import module (config/custom_sections.py)."""

import pytest
from harness import ROOT

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import to_toml
from torchtitan_like.validate import parse_args

PLUGIN = str(ROOT / "tests/plugins/research_section.py")


def test_section_from_toml_and_command_line(tmp_path):
    toml = tmp_path / "job.toml"
    toml.write_text(f'[job]\ncustom_import = ["{PLUGIN}"]\n\n[research]\nz_coef = 0.5\n')
    config = parse_args(["--job.config_file", str(toml)], 1)
    assert (config.research.z_coef, config.research.router) == (0.5, "softmax")
    config = parse_args(["--job.config_file", str(toml), "--research.router=sigmoid"], 1)
    assert (config.research.z_coef, config.research.router) == (0.5, "sigmoid")
    assert "[research]\nz_coef = 0.5\nrouter = \"sigmoid\"" in to_toml(config)


@pytest.mark.parametrize(("override", "error"), [
    ("--research.z_cof=1", r"unknown key 'z_cof' in section \[research\].*did you mean 'z_coef'"),
    ("--research.router=tanh", r"\[research\] router .*expected one of 'softmax', 'sigmoid'"),
    ("--research.z_coef=-1", r"\[research\] z_coef = -1.0: must be >= 0"),
])
def test_section_values_are_checked_at_start_up(override, error):
    with pytest.raises(ConfigError, match=error):
        parse_args(["--job.custom_import", PLUGIN, override], 1)


def test_help_lists_the_section(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--job.custom_import", PLUGIN, "--help"], 1)
    out = capsys.readouterr().out
    assert "[research]" in out and "--research.z_coef  (float, default 0.0001)" in out
    assert "Weight of the z-loss term." in out
