"""[model] overrides: fields of the flavor's args replaced from the TOML or the command line,
nested dataclass fields (MoEArgs) included, type-checked, unknown names refused, the args'
own checks and their validation against the job run on the result; every caller of
model_spec_and_args sees them."""

import dataclasses
import json

import pytest

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import to_toml
from torchtitan_like.models.qwen3 import qwen3_flavors
from torchtitan_like.models.registry import apply_overrides, model_spec_and_args
from torchtitan_like.tools.plan_cli import main as plan_main
from torchtitan_like.tools.planner import from_job_config
from torchtitan_like.validate import parse_args

TINY = ["--model.flavor=tiny"]
QWEN3_MOE = ["--model.name=qwen3", "--model.flavor=debugmodel_moe"]


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
    ("--model.overrides.n_layer=8", r"has no field 'n_layer'; did you mean 'n_layers'"),
    ("--model.overrides.n_layers=eight", r"overrides.n_layers: got 'eight', expected int"),
    ("--model.overrides.rope_scaling=1", r"is a group of fields \(RopeScaling\)"),
])
def test_bad_overrides_are_refused_at_start_up(override, error):
    with pytest.raises(ConfigError, match=error):
        parse_args([*TINY, override], 1)


def test_the_planner_sees_the_override():
    shape, _, _ = from_job_config(parse_args([*TINY, "--model.overrides.n_layers=3"], 1), 1)
    assert shape.n_layers == 3


def test_nested_fields_from_the_toml_and_the_command_line(tmp_path):
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nname = "qwen3"\nflavor = "debugmodel_moe"\n'
                    "[model.overrides]\nn_layers = 2\nmoe = { num_experts = 16, top_k = 4 }\n")
    args = model_spec_and_args(parse_args(["--job.config_file", str(toml)], 1))[1]
    assert (args.n_layers, args.moe.num_experts, args.moe.top_k) == (2, 16, 4)
    config = parse_args(["--job.config_file", str(toml), "--model.overrides.moe.top_k=1"], 1)
    args = model_spec_and_args(config)[1]
    assert (args.moe.num_experts, args.moe.top_k) == (16, 1)  # the CLI wins per nested key
    assert 'moe = { num_experts = 16, top_k = "1" }' in to_toml(config)
    dotted = tmp_path / "dotted.toml"  # TOML's dotted keys are the same nested table
    dotted.write_text('[model]\nname = "qwen3"\nflavor = "debugmodel_moe"\n'
                      "overrides.moe.num_experts = 4\n")
    assert model_spec_and_args(parse_args(["--job.config_file", str(dotted)], 1))[1].moe == (
        dataclasses.replace(qwen3_flavors["debugmodel_moe"].moe, num_experts=4))
    assert qwen3_flavors["debugmodel_moe"].moe.num_experts == 8  # the flavor is not touched


@pytest.mark.parametrize(("override", "error"), [
    ("--model.overrides.moe.top_k=two", r"overrides.moe.top_k: got 'two', expected int"),
    ("--model.overrides.moe.num_expert=4",
     r"overrides.moe.num_expert: MoEArgs has no field 'num_expert'; did you mean 'num_experts'"),
    ("--model.overrides.moe.top_k=9",  # MoEArgs' own check, on the overridden values
     r"overrides.moe: MoEArgs: top_k = 9 must be in 1..num_experts \(8\)"),
    ("--model.overrides.moe=4", r"overrides.moe is a group of fields \(MoEArgs\): set them one "
     r"by one, e.g. --model.overrides.moe.num_experts=..."),
    ("--model.overrides.n_layers.x=4", r"overrides.n_layers is a int, not a group of fields"),
])
def test_bad_nested_overrides_are_refused_at_start_up(override, error):
    with pytest.raises(ConfigError, match=error):
        parse_args([*QWEN3_MOE, override], 1)


def test_none_switches_an_optional_field_off():
    args = args_of_moe(["--model.overrides.moe.load_balance_coeff=none"])
    assert args.moe.load_balance_coeff is None and args.moe.num_experts == 8
    assert args_of_moe(["--model.overrides.moe=None"]).moe is None  # qwen3 turned dense
    with pytest.raises(ConfigError, match=r"overrides.n_layers: got 'none', expected int"):
        args_of_moe(["--model.overrides.n_layers=none"])


def args_of_moe(argv):
    return model_spec_and_args(parse_args([*QWEN3_MOE, *argv], 1))[1]


def test_a_nested_field_that_the_flavor_lacks_is_refused():
    with pytest.raises(ConfigError, match=r"overrides.moe is None in this flavor"):
        parse_args(["--model.name=qwen3", "--model.flavor=debugmodel",
                    "--model.overrides.moe.top_k=1"], 1)


def test_the_job_is_validated_against_the_overridden_args():
    ep2 = ["--parallelism.expert_parallel_degree=2", "--model.overrides.moe.top_k=1"]
    parse_args([*QWEN3_MOE, *ep2], 2)
    with pytest.raises(ConfigError, match=r"expert_parallel_degree = 2 .*3"):
        parse_args([*QWEN3_MOE, *ep2, "--model.overrides.moe.num_experts=3"], 2)


def test_ttl_plan_reads_nested_overrides_from_a_config(tmp_path, capsys):
    params = []
    for table in ("", "[model.overrides]\nmoe = { num_experts = 16 }\n"):
        toml = tmp_path / "plan.toml"
        toml.write_text(f'[model]\nname = "qwen3"\nflavor = "debugmodel_moe"\n{table}')
        assert plan_main(["--config", str(toml), "--num_gpus", "2", "--json"]) == 0
        params.append(json.loads(capsys.readouterr().out)["memory_gib"]["parameters"])
    assert params[1] > params[0]


def test_the_planner_sees_a_nested_override():
    shapes = [from_job_config(parse_args([*QWEN3_MOE, *extra], 1), 1)[0]
              for extra in ([], ["--model.overrides.moe.num_experts=16"])]
    assert shapes[1].args.moe.num_experts == 16
    assert shapes[1].num_params > shapes[0].num_params


@dataclasses.dataclass
class _Collections:
    sizes: list[int] = dataclasses.field(default_factory=list)


def test_a_collection_field_cannot_be_overridden():
    with pytest.raises(ConfigError, match=r"overrides.sizes: field of type list\[int\] cannot "
                       "be overridden"):
        apply_overrides(_Collections(), {"sizes": [1]})
